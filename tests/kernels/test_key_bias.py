"""The per-key bias of ragged attention (ToMe's proportional attention): the reference against its defining
property, the interpreted Triton kernels and the CPU path against the float64 reference, the op schema and the
argument checks."""

from __future__ import annotations

import pytest
import torch
from _kernel_cases import check_against_reference, make_batch, poisoned_outputs, relpos_inputs

from raggedvit.kernels import ragged_attention
from raggedvit.kernels._launch import _launch_triton
from raggedvit.kernels.reference import ragged_attention_reference
from tests.support.testing import assert_close


def _key_bias(T: int, gen: torch.Generator) -> torch.Tensor:
    """log of random token sizes 1..8 ([T] float32): the bias ToMe's proportional attention adds."""
    return torch.randint(1, 9, (T,), generator=gen).to(torch.float32).log()


def test_log_size_bias_equals_repeated_keys(gen):
    """Attention with key_bias log(c_k) equals plain attention in which key k appears c_k times: proportional
    attention counts a merged token as the tokens it holds (an integer c, float64)."""
    H, D, n = 2, 16, 7
    qkv = torch.randn(n, 3 * H * D, generator=gen, dtype=torch.float64)
    counts = torch.randint(1, 5, (n,), generator=gen)
    cu = torch.tensor([0, n])
    out, cls = ragged_attention_reference(qkv, cu, H, return_cls_attn=True, key_bias=counts.double().log())
    q, k, v = qkv.reshape(n, 3, H, D).unbind(1)
    rep = torch.repeat_interleave(torch.arange(n), counts)  # key k, c_k times
    s = torch.einsum("qhd,khd->hqk", q, k[rep]) * D**-0.5
    p = torch.softmax(s, dim=-1)
    want = torch.einsum("hqk,khd->qhd", p, v[rep]).reshape(n, H * D)
    assert_close(out, want, rtol=1e-12, atol=1e-12, name="out")
    per_key = torch.zeros(H, n, dtype=torch.float64).index_add_(1, rep, p[:, 0])  # row 0's weight per key
    assert_close(cls, per_key.mean(0), rtol=1e-12, atol=1e-12, name="cls_attn")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("lengths", [[21, 7, 1, 15], [64, 65]], ids=str)
@pytest.mark.parametrize("cu_dtype", [torch.int32, torch.int64], ids=str)
def test_kernels_match_reference(interpreted, gen, dtype, lengths, cu_dtype):
    H, D = 3, 32
    qkv, cu = make_batch(lengths, H, D, dtype, gen, cu_dtype=cu_dtype)
    kb = _key_bias(qkv.shape[0], gen)
    out, cls_attn = poisoned_outputs(qkv, H)
    _launch_triton(qkv, cu, H, D**-0.5, True, kernels=interpreted, out=out, cls_attn=cls_attn, key_bias=kb)
    check_against_reference(out, cls_attn, qkv, cu, H, pos={"key_bias": kb}, name="triton")
    out, cls_attn = ragged_attention(qkv, cu, H, return_cls_attn=True, key_bias=kb)
    check_against_reference(out, cls_attn, qkv, cu, H, pos={"key_bias": kb}, name="cpu")


def test_dead_rows_with_key_bias(interpreted, gen):
    """Rows past cu[B] (the capacity layout) stay zero with a key bias, in both implementations."""
    H, D = 2, 32
    qkv, cu = make_batch([9, 4, 6], H, D, torch.float16, gen)
    cu[-1] = 13  # the last sequence's rows are dead
    kb = _key_bias(19, gen)
    out, cls_attn = poisoned_outputs(qkv, H)
    _launch_triton(qkv, cu, H, D**-0.5, True, kernels=interpreted, out=out, cls_attn=cls_attn, key_bias=kb)
    for o, c in ((out, cls_attn), ragged_attention(qkv, cu, H, return_cls_attn=True, key_bias=kb)):
        assert bool((o[13:] == 0).all()) and bool((c[13:] == 0).all())
        check_against_reference(o[:13], c[:13], qkv[:13], cu, H, pos={"key_bias": kb[:13]})


def test_with_bias_and_pos(interpreted, gen):
    """key_bias adds to the relative position bias and the qkv bias."""
    H, D, lengths = 2, 32, [10, 3]
    qkv, cu = make_batch(lengths, H, D, torch.float32, gen)
    pos = relpos_inputs(lengths, H, (3, 3), 1, gen)
    bias = torch.randn(3 * H * D, generator=gen)
    kb = _key_bias(qkv.shape[0], gen)
    want = {**pos, "key_bias": kb}
    got = ragged_attention(qkv, cu, H, return_cls_attn=True, bias=bias, key_bias=kb, **pos)
    check_against_reference(*got, qkv + bias, cu, H, pos=want, name="cpu")
    got = _launch_triton(qkv, cu, H, D**-0.5, True, kernels=interpreted, bias=bias, key_bias=kb, **pos)
    check_against_reference(*got, qkv + bias, cu, H, pos=want, name="triton")


def test_zero_bias_is_no_bias(gen):
    H, D = 2, 32
    qkv, cu = make_batch([9, 4], H, D, torch.float32, gen)
    plain = ragged_attention(qkv, cu, H, return_cls_attn=True)
    zero = ragged_attention(qkv, cu, H, return_cls_attn=True, key_bias=torch.zeros(13))
    for a, b in zip(plain, zero):
        assert torch.equal(a, b)


def test_opcheck(gen):
    H = 2
    qkv, cu = make_batch([5, 1, 9], H, 16, torch.float32, gen, cu_dtype=torch.int64)
    kb = _key_bias(15, gen)
    for cls in (True, False):
        torch.library.opcheck(
            torch.ops.raggedvit.ragged_attention.default, (qkv, cu, None, H, 0.25, cls, None, None, 0, 0, 0, kb)
        )
    out = torch.ops.raggedvit.ragged_attention(qkv, cu, None, H, 0.25, False, None, None, 0, 0, 0, kb)[0]
    assert_close(out, ragged_attention(qkv, cu, H, scale=0.25, key_bias=kb), name="op")


@pytest.mark.parametrize(
    ("key_bias", "match"),
    [
        (torch.zeros(5), r"key_bias must be \[6\] float32"),
        (torch.zeros(6, dtype=torch.float16), r"got \(6,\) torch.float16"),
        (torch.zeros(6, 1), r"got \(6, 1\)"),
    ],
)
def test_bad_key_bias_raises(key_bias, match):
    with pytest.raises(ValueError, match=match):
        ragged_attention(torch.zeros(6, 3 * 2 * 8), torch.tensor([0, 6], dtype=torch.int32), 2, key_bias=key_bias)
