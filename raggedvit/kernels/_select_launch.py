"""Host launcher of the Triton selection kernels (`_select_kernel`: `_select_count`, then `_select_scatter`).

`launch_select` takes validated, contiguous tensors: CUDA tensors with the JIT kernels, or CPU tensors in a
process started with TRITON_INTERPRET=1. No host read of device data; the grid is (B,) for both launches.
"""

from __future__ import annotations

import struct
from types import ModuleType

import torch

from raggedvit.kernels._select_kernel import SELECT_BLOCK, select_launch_config

__all__ = ["float_bits", "launch_select"]


def float_bits(value: float) -> int:
    """IEEE-754 bits of float32(value) as a signed int32 (the kernels take float scalars as bits)."""
    return struct.unpack("<i", struct.pack("<f", value))[0]


def _default_kernels() -> ModuleType:
    from raggedvit.kernels import _select_kernel

    return _select_kernel


def launch_select(
    scores: torch.Tensor,
    cu: torch.Tensor,
    width: int,
    bound: int,
    num_prefix: int,
    policy: int,
    keep: float,
    mass: float,
    *,
    kernels: ModuleType | None = None,
    config: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """scores [T] float32, cu [B+1] int64 (B >= 1) -> (src, cu_new, seq_id, pos [B*bound] / [B+1], k [B]) int64,
    the rows of `select.select_rows_reference` (mass policy: up to the float order of its sums).
    config: (WP, num_warps) instead of select_launch_config(width) (tests: a WP below the width runs the pairwise
    path)."""
    T = scores.shape[0]
    B = cu.shape[0] - 1
    dev = scores.device
    src = torch.empty(B * bound, dtype=torch.int64, device=dev)
    seq_id = torch.empty_like(src)
    pos = torch.empty_like(src)
    cu_new = torch.empty(B + 1, dtype=torch.int64, device=dev)
    k = torch.empty(B, dtype=torch.int64, device=dev)
    mod = _default_kernels() if kernels is None else kernels
    wp, warps = select_launch_config(width) if config is None else config
    mod._select_count[(B,)](
        scores, cu, k, T, B, width, num_prefix, policy, float_bits(keep), float_bits(mass), BLOCK=SELECT_BLOCK,
        WP=wp, num_warps=warps,
    )  # fmt: skip
    mod._select_scatter[(B,)](
        scores, cu, k, src, cu_new, seq_id, pos, T, B, width, bound, num_prefix, BLOCK=SELECT_BLOCK, WP=wp,
        num_warps=warps,
    )  # fmt: skip
    return src, cu_new, seq_id, pos, k
