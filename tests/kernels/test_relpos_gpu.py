"""Relative position bias on the CUDA (Triton JIT) path vs the float64 reference. GPU only.

Run on the GPU machine: python -m pytest tests/kernels/test_relpos_gpu.py -m gpu
"""

from __future__ import annotations

import pytest
import torch
from _kernel_cases import DTYPES, check_against_reference, make_batch, poisoned_outputs, random_lengths, relpos_inputs

from raggedvit.kernels import ragged_attention
from raggedvit.kernels._launch import _FAST, _launch_triton
from raggedvit.kernels.reference import pos_table_size

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("D", [32, 64, 80, 128])
@pytest.mark.parametrize(("grid", "p"), [((14, 14), 1), ((7, 9), 0), ((2, 2), 4)])
def test_random_batches(gen, dtype, D, grid, p):
    H = 12 if D == 64 else 3
    lengths = random_lengths(gen, 48, 12000, choices=(1, 2, 63, 64, 65, 197, 300))
    cu_dtype = torch.int32 if int(torch.randint(0, 2, (1,), generator=gen)) else torch.int64
    qkv, cu = make_batch(lengths, H, D, dtype, gen, cu_dtype=cu_dtype, device="cuda")
    pos = relpos_inputs(lengths, H, grid, p, gen, cu_dtype=cu_dtype, odd_rows=8, device="cuda")
    out, cls_attn = poisoned_outputs(qkv, H)
    _launch_triton(qkv, cu, H, D**-0.5, True, out=out, cls_attn=cls_attn, **pos)
    check_against_reference(out, cls_attn, qkv, cu, H, pos=pos, name=f"lengths={lengths}")
    for i in range(2):  # the second call takes the cached fast launch (its key includes has_pos)
        out, cls_attn = ragged_attention(qkv, cu, H, return_cls_attn=True, **pos)
        check_against_reference(out, cls_attn, qkv, cu, H, pos=pos, name=f"call {i}")
        plain = ragged_attention(qkv, cu, H)  # the same shapes without pos: the other kernel, not a stale cache
        check_against_reference(plain, None, qkv, cu, H, name=f"call {i} without pos")


def test_fast_launch_entries_are_separate(gen):
    qkv, cu = make_batch([197, 50], 12, 64, torch.float16, gen, device="cuda")
    pos = relpos_inputs([197, 50], 12, (14, 14), 1, gen, device="cuda")
    ragged_attention(qkv, cu, 12, return_cls_attn=True, **pos)
    ragged_attention(qkv, cu, 12, return_cls_attn=True)
    keys = [k for k in _FAST if k[1] == torch.float16 and k[3:6] == (12, 64, 1)]
    assert {k[6] for k in keys} == {False, True}, keys


def test_any_token_pos_stays_in_the_table(gen):
    """Extreme token_pos values with the table between NaN guards: finite outputs equal to the reference."""
    H, D, grid = 3, 64, (5, 6)
    R = pos_table_size(grid)
    for cu_dtype in (torch.int32, torch.int64):
        qkv, cu = make_batch([31, 64, 7], H, D, torch.float16, gen, cu_dtype=cu_dtype, device="cuda")
        pos = relpos_inputs([31, 64, 7], H, grid, 1, gen, cu_dtype=cu_dtype, odd_rows=60, device="cuda")
        guarded = torch.full((H * R + 256,), float("nan"), device="cuda")
        guarded[128 : 128 + H * R] = pos["pos_table"].flatten()
        pos["pos_table"] = guarded[128 : 128 + H * R].view(H, R)
        out, cls_attn = ragged_attention(qkv, cu, H, return_cls_attn=True, **pos)
        check_against_reference(out, cls_attn, qkv, cu, H, pos=pos)


def test_cuda_graph_capture_with_pos(gen):
    qkv, cu = make_batch([197, 99, 40], 12, 64, torch.float16, gen, device="cuda")
    pos = relpos_inputs([197, 99, 40], 12, (14, 14), 1, gen, device="cuda")
    ragged_attention(qkv, cu, 12, return_cls_attn=True, **pos)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, cls_attn = ragged_attention(qkv, cu, 12, return_cls_attn=True, **pos)
    pos["token_pos"].copy_(pos["token_pos"].flip(0))
    graph.replay()
    torch.cuda.synchronize()
    check_against_reference(out, cls_attn, qkv, cu, 12, pos=pos)
