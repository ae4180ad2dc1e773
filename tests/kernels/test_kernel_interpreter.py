"""The Triton kernels under the interpreter (CPU tensors) vs the float64 reference, with poisoned outputs."""

from __future__ import annotations

import math
from types import ModuleType

import pytest
import torch
from _kernel_cases import check_against_reference, make_batch, poisoned_outputs, random_lengths, reference

from raggedvit.kernels._config import KernelConfig, block_d, fwd_grid, pick_config
from raggedvit.kernels._launch import _launch_triton
from tests.support.testing import assert_close

# (dtype, D, H, max tokens): every dtype, D and H appears; token budgets keep the interpreter fast
CASES = [
    (torch.float16, 64, 12, 200),
    (torch.float16, 32, 1, 800),
    (torch.float16, 80, 3, 300),
    (torch.bfloat16, 128, 1, 600),
    (torch.bfloat16, 64, 3, 400),
    (torch.bfloat16, 32, 12, 200),
    (torch.float32, 32, 3, 400),
    (torch.float32, 80, 1, 450),
    (torch.float32, 128, 3, 200),
]


def run(kernels: ModuleType, qkv, cu, H, *, scale=None, config=None, cls=True):
    out, cls_attn = poisoned_outputs(qkv, H)
    D = qkv.shape[1] // (3 * H)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    return _launch_triton(qkv, cu, H, scale, cls, kernels=kernels, config=config, out=out, cls_attn=cls_attn)


@pytest.mark.parametrize(("dtype", "D", "H", "max_tokens"), CASES, ids=lambda v: str(v).replace("torch.", ""))
def test_random_batches(interpreted, gen, dtype, D, H, max_tokens):
    lengths = random_lengths(gen, 8, max_tokens)
    cu_dtype = torch.int32 if int(torch.randint(0, 2, (1,), generator=gen)) else torch.int64
    qkv, cu = make_batch(lengths, H, D, dtype, gen, cu_dtype=cu_dtype)
    out, cls_attn = run(interpreted, qkv, cu, H)
    check_against_reference(out, cls_attn, qkv, cu, H, name=f"lengths={lengths}")


def test_small_tiles_over_short_and_empty_sequences(interpreted, gen):
    """16-row tiles over lengths 0..33: partial tiles, empty sequences (programs with no tile) in between."""
    lengths = [1, 2, 17, 0, 1, 33, 2, 0, 16, 1]
    qkv, cu = make_batch(lengths, 2, 16, torch.float16, gen)
    cfg = KernelConfig("fp16", 16, 16, 16, 4, 1, 16, 4)
    out, cls_attn = run(interpreted, qkv, cu, 2, config=cfg, scale=0.3)
    check_against_reference(out, cls_attn, qkv, cu, 2, scale=0.3)


def test_sequences_longer_than_their_programs_loop(interpreted, gen):
    """Skewed lengths: J = cdiv(cdiv(T, B), BLOCK_M) = 2 programs per sequence, so the 70-row sequence (5 tiles of 16)
    is run by its 2 programs in 3 and 2 tiles, the others in one or none."""
    qkv, cu = make_batch([70, 1, 0, 2], 2, 16, torch.float16, gen)
    cfg = KernelConfig("fp16", 16, 16, 16, 4, 1, 16, 4)
    assert fwd_grid(73, 4, 16) == (2, 4 * 2 + 2)
    out, cls_attn = run(interpreted, qkv, cu, 2, config=cfg)
    check_against_reference(out, cls_attn, qkv, cu, 2)


def test_head_dim_not_power_of_two(interpreted, gen):
    qkv, cu = make_batch([5, 9], 2, 8, torch.float32, gen)  # BLOCK_D = 16 > D
    out, cls_attn = run(interpreted, qkv, cu, 2)
    check_against_reference(out, cls_attn, qkv, cu, 2)


def test_without_cls_attn(interpreted, gen):
    qkv, cu = make_batch([65, 3], 3, 32, torch.float16, gen)
    out, cls_attn = run(interpreted, qkv, cu, 3, cls=False)
    assert cls_attn.shape == (0,)
    check_against_reference(out, None, qkv, cu, 3)


def test_single_token(interpreted, gen):
    qkv, cu = make_batch([1], 3, 32, torch.float32, gen)
    out, cls_attn = run(interpreted, qkv, cu, 3)
    torch.testing.assert_close(out, qkv[:, 2 * 96 :], rtol=0, atol=0)  # softmax of one key = 1: out = v
    # Lse comes from tl.dot, the cls score from an elementwise sum: equal up to an ulp
    torch.testing.assert_close(cls_attn, torch.ones(1), rtol=1e-6, atol=1e-6)


def test_empty_launches_nothing():
    qkv = torch.empty(0, 3 * 2 * 32, dtype=torch.float16)
    out, cls_attn = _launch_triton(qkv, torch.zeros(1, dtype=torch.int32), 2, 0.1, True, kernels=object())
    assert out.shape == (0, 64) and cls_attn.shape == (0,)


@pytest.mark.parametrize(
    "cu_values",
    [
        [0, 40, 20, 64],
        [0, 30, 500, 64],
        [0, 10, 64, 30],
        [5, -3, 64],
        [0, 1000],
        [0, 20],
        [-7, -7],
        [10, 20, 64],
        [9],
        [0, 50, 3, 2, 60],
    ],
    ids=[
        "decreasing",
        "beyond-T",
        "last-below-T",
        "negative",
        "huge",
        "short",
        "all-negative",
        "first-nonzero",
        "no-sequence",
        "zigzag",
    ],
)
def test_bad_cu_stays_in_bounds(interpreted, gen, cu_values):
    """Bad cu_seqlens: no exception, no read outside qkv (NaN guard rows), no write outside out/cls_attn, and every
    row of out / cls_attn written (each row lies in at least one sequence or in the dead rows)."""
    T, H, D, G = 64, 2, 32, 16
    width = 3 * H * D
    buf = torch.full((T + 2 * G, width), float("nan"), dtype=torch.float16)
    buf[G : G + T] = torch.randn(T, width, generator=gen).half()
    qkv = buf[G : G + T]
    out_buf = torch.full((T + 2 * G, H * D), 7.0, dtype=torch.float16)
    out_buf[G : G + T] = float("nan")
    cls_buf = torch.full((T + 2 * G,), 7.0)
    cls_buf[G : G + T] = float("nan")
    cu = torch.tensor(cu_values, dtype=torch.int32)
    cfg = pick_config(T, D, torch.float16)
    out, cls_attn = out_buf[G : G + T], cls_buf[G : G + T]
    _launch_triton(qkv, cu, H, 0.2, True, kernels=interpreted, config=cfg, out=out, cls_attn=cls_attn)
    assert torch.isfinite(out_buf[G : G + T].float()).all(), "rows read guard memory or were left unwritten"
    assert (out_buf[:G] == 7).all() and (out_buf[G + T :] == 7).all(), "out written out of bounds"
    assert (cls_buf[:G] == 7).all() and (cls_buf[G + T :] == 7).all(), "cls_attn written out of bounds"
    assert not torch.isnan(cls_buf[G : G + T]).any(), "cls_attn left unwritten"


def test_block_d():
    assert [block_d(d) for d in (1, 16, 17, 32, 64, 80, 128, 129, 256)] == [16, 16, 32, 32, 64, 128, 128, 256, 256]


def test_many_sequences_use_the_coarse_search(interpreted, gen):
    """B >= 64 (the fp16 cu chunk): the bounds search goes through its coarse pass."""
    lengths = torch.randint(0, 4, (150,), generator=gen).tolist()
    lengths[0] = 1
    qkv, cu = make_batch(lengths, 1, 16, torch.float16, gen)
    cfg = KernelConfig("fp16", 16, 64, 16, 4, 1, 4, 4)
    out, cls_attn = run(interpreted, qkv, cu, 1, config=cfg)
    check_against_reference(out, cls_attn, qkv, cu, 1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_bias_is_added_on_load(interpreted, gen, dtype):
    """bias [3*H*D] (the qkv Linear's): same result as attention of qkv + bias (summed in qkv's dtype)."""
    H, D = 3, 32
    qkv, cu = make_batch([7, 1, 20, 5], H, D, dtype, gen)
    bias = torch.randn(3 * H * D, generator=gen).to(dtype)
    out, cls_attn = poisoned_outputs(qkv, H)
    out, cls_attn = _launch_triton(
        qkv, cu, H, 1.0 / math.sqrt(D), True, kernels=interpreted, out=out, cls_attn=cls_attn, bias=bias
    )
    # what the kernel computes: q + bq in qkv's dtype, the k bias cancelled by the softmax, + bv on the output
    q_biased = qkv.clone()
    q_biased[:, : H * D] += bias[: H * D]
    ref_out, ref_cls = reference(q_biased, cu, H)
    ref_out = ref_out + bias[2 * H * D :].double()
    check_against_reference(out, cls_attn, qkv, cu, H, name="with bias", ref=(ref_out, ref_cls))
    # and the op's contract: attention of qkv + bias, up to the rounding of k + bk in qkv's dtype
    plain_out, plain_cls = reference(qkv + bias, cu, H)
    assert_close(out, plain_out.to(dtype), name="bias: attention of qkv + bias")
    assert_close(cls_attn, plain_cls.float(), rtol=1e-3, name="bias: cls_attn of qkv + bias")


@pytest.mark.parametrize("cu_dtype", [torch.int32, torch.int64])
def test_dead_rows_past_cu_are_zero(interpreted, gen, cu_dtype):
    """The capacity layout: rows >= cu[B] are dead. 16-row tiles: live, mixed and all-dead tiles; the poisoned
    outputs must come back zero there (out and cls_attn), the live rows equal to the reference."""
    qkv_live, cu = make_batch([5, 0, 20, 1], 2, 16, torch.float32, gen, cu_dtype=cu_dtype)
    qkv = torch.cat((qkv_live, torch.randn(37, qkv_live.shape[1], generator=gen)))  # rows 26..62 dead
    cfg = KernelConfig("fp32", 16, 16, 16, 4, 1, 16, 4)
    out, cls_attn = run(interpreted, qkv, cu, 2, config=cfg)
    live = int(cu[-1])
    check_against_reference(out[:live], cls_attn[:live], qkv_live, cu, 2)
    assert (out[live:] == 0).all() and (cls_attn[live:] == 0).all()
    ref_out, ref_cls = reference(qkv, cu, 2)  # the reference has the same dead-row contract
    assert (ref_out[live:] == 0).all() and (ref_cls[live:] == 0).all()
