"""Public `ragged_attention` on CPU tensors, its input checks, and the custom op under torch.export."""

from __future__ import annotations

import math

import pytest
import torch
from _kernel_cases import DTYPES, check_against_reference, make_batch, random_lengths

from raggedvit.kernels import ragged_attention


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("D", "H"), [(32, 12), (64, 3), (80, 1), (128, 3)])
def test_cpu_matches_reference(gen, dtype, D, H):
    lengths = random_lengths(gen, 64, 1500)
    cu_dtype = torch.int32 if int(torch.randint(0, 2, (1,), generator=gen)) else torch.int64
    qkv, cu = make_batch(lengths, H, D, dtype, gen, cu_dtype=cu_dtype)
    out, cls_attn = ragged_attention(qkv, cu, H, return_cls_attn=True)
    check_against_reference(out, cls_attn, qkv, cu, H, name=f"lengths={lengths}")
    torch.testing.assert_close(ragged_attention(qkv, cu, H), out, rtol=0, atol=0)


def test_cpu_scale_and_empty_sequences(gen):
    qkv, cu = make_batch([3, 0, 7, 0], 2, 16, torch.float32, gen)
    out, cls_attn = ragged_attention(qkv, cu, 2, scale=0.7, return_cls_attn=True)
    check_against_reference(out, cls_attn, qkv, cu, 2, scale=0.7)


def test_empty_batch():
    qkv = torch.empty(0, 3 * 4 * 16)
    out, cls_attn = ragged_attention(qkv, torch.zeros(1, dtype=torch.int64), 4, return_cls_attn=True)
    assert out.shape == (0, 64) and cls_attn.shape == (0,) and cls_attn.dtype == torch.float32


def test_single_token(gen):
    qkv, cu = make_batch([1], 1, 8, torch.float32, gen)
    out, cls_attn = ragged_attention(qkv, cu, 1, return_cls_attn=True)
    torch.testing.assert_close(out, qkv[:, 16:])
    torch.testing.assert_close(cls_attn, torch.ones(1))


@pytest.mark.parametrize(
    ("qkv", "cu", "H", "match"),
    [
        (torch.zeros(4, 3, 96), torch.tensor([0, 4]), 2, "2-D"),
        (torch.zeros(4, 95), torch.tensor([0, 4]), 2, "multiple of 3\\*num_heads"),
        (torch.zeros(4, 96, dtype=torch.float64), torch.tensor([0, 4]), 2, "dtype must be float16"),
        (torch.zeros(4, 96), torch.tensor([[0, 4]]), 2, "1-D"),
        (torch.zeros(4, 96), torch.tensor([0.0, 4.0]), 2, "int32 or int64"),
        (torch.zeros(4, 96), torch.tensor([0, 4]), 0, "num_heads must be >= 1"),
        (torch.zeros(4, 96), torch.tensor([0, 5]), 2, "cu_seqlens must rise from 0 to at most T=4"),
        (torch.zeros(4, 96), torch.tensor([0, 3, 2, 4]), 2, "cu_seqlens must rise"),
    ],
)
def test_bad_inputs_raise(qkv, cu, H, match):
    with pytest.raises(ValueError, match=match):
        ragged_attention(qkv, cu, H)


def test_opcheck(gen):
    qkv, cu = make_batch([5, 1, 9], 2, 16, torch.float32, gen)
    bias = torch.randn(qkv.shape[1], generator=gen)
    for cls in (True, False):
        for b in (None, bias):
            torch.library.opcheck(torch.ops.raggedvit.ragged_attention.default, (qkv, cu, b, 2, 0.25, cls))


def test_bias_is_attention_of_qkv_plus_bias(gen):
    qkv, cu = make_batch([5, 1, 9], 2, 16, torch.float32, gen)
    bias = torch.randn(qkv.shape[1], generator=gen)
    got, got_cls = ragged_attention(qkv, cu, 2, bias=bias, return_cls_attn=True)
    want, want_cls = ragged_attention(qkv + bias, cu, 2, return_cls_attn=True)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_cls, want_cls)


class _PrunedAttention(torch.nn.Module):
    """Keeps the rows where keep is set (data-dependent T) and attends within one sequence."""

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = keep.nonzero().squeeze(1)
        packed = x[rows]
        cu = torch.cat([torch.zeros(1, dtype=torch.int64), keep.sum().reshape(1)])
        return ragged_attention(packed, cu, 2, return_cls_attn=True)


def test_export_with_data_dependent_tokens(gen):
    x = torch.randn(10, 3 * 2 * 16, generator=gen)
    keep = torch.tensor([1, 1, 0, 1, 0, 1, 1, 1, 0, 1], dtype=torch.bool)
    ep = torch.export.export(_PrunedAttention(), (x, keep))
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    assert torch.ops.raggedvit.ragged_attention.default in targets
    keep2 = torch.tensor([1, 0, 0, 1, 0, 1, 0, 0, 0, 0], dtype=torch.bool)
    out, cls_attn = ep.module()(x, keep2)
    ref = ragged_attention(x[keep2], torch.tensor([0, 3]), 2, return_cls_attn=True)
    torch.testing.assert_close(out, ref[0])
    torch.testing.assert_close(cls_attn, ref[1])
    assert math.isclose(float(cls_attn.sum()), 1.0, rel_tol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cpu_dead_rows_past_cu_are_zero(gen, dtype):
    """cu[B] < T (the capacity layout): the live rows as without the tail, zeros in the dead rows."""
    qkv_live, cu = make_batch([7, 0, 12], 3, 16, dtype, gen)
    qkv = torch.cat((qkv_live, torch.randn(9, qkv_live.shape[1], generator=gen).to(dtype)))
    out, cls_attn = ragged_attention(qkv, cu, 3, return_cls_attn=True)
    want, want_cls = ragged_attention(qkv_live, cu, 3, return_cls_attn=True)
    torch.testing.assert_close(out[:19], want, rtol=0, atol=0)
    torch.testing.assert_close(cls_attn[:19], want_cls, rtol=0, atol=0)
    assert (out[19:] == 0).all() and (cls_attn[19:] == 0).all()
