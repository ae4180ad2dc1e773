"""Host launcher of the Triton merge kernel (`_merge_kernel._ragged_merge`, one tome stage's merge in one launch).

`launch_merge` takes validated, contiguous tensors: CUDA tensors with the JIT kernel, or CPU tensors in a process
started with TRITON_INTERPRET=1. No host read of device data (n = T / B from the shapes); grid (B,).
"""

from __future__ import annotations

from types import ModuleType

import torch

from raggedvit.kernels._merge_kernel import (
    MERGE_BLOCK_A,
    MERGE_BLOCK_B,
    MERGE_BLOCK_M,
    MERGE_BLOCK_ROWS,
    merge_block_c,
    merge_head_block,
    merge_launch_config,
)
from raggedvit.pruning.merge import merge_widths, merged_count

__all__ = ["launch_merge"]


def _default_kernels() -> ModuleType:
    from raggedvit.kernels import _merge_kernel

    return _merge_kernel


def _head_block(head_dim: int) -> int:
    """BLOCK_D of the JIT launch: the AOT build's (`merge_head_block`: the same bits as the CUDA EP), else the next
    power of two >= head_dim."""
    return merge_head_block(head_dim) or 1 << max(0, head_dim - 1).bit_length()


def launch_merge(
    x: torch.Tensor,
    qkv: torch.Tensor,
    qkv_bias: torch.Tensor | None,
    size: torch.Tensor | None,
    cu: torch.Tensor,
    num_heads: int,
    num_prefix: int,
    r: int,
    class_token: bool,
    *,
    skip: torch.Tensor | None = None,
    skip_bias: torch.Tensor | None = None,
    kernels: ModuleType | None = None,
    config: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, C], qkv [T, 3*H*Dh] (x's dtype), qkv_bias [3*H*Dh] or None, size [T] float32 or None, cu [B+1] int64
    (only its length is read) -> (x_out [B*m, C], size_out [B*m] float32, cu_out [B+1] int64, src [B*m] int64,
    key_bias [B*m] float32, score [B*n_A] float32): `merge.merge_tokens_reference`'s outputs; skip [T, C] and
    skip_bias [C] (x's dtype, or None): its fused attention residual (`merge.residual_rows`).
    config: (NP, num_warps) instead of merge_launch_config(n_A) (tests: a wider NP than needed)."""
    T, C = x.shape
    B = cu.shape[0] - 1
    n = T // B
    head_dim = qkv.shape[1] // 3 // num_heads
    m, n_a = n - merged_count(n, num_prefix, r), merge_widths(n, num_prefix)[0]
    dev = x.device
    x_out = torch.empty(B * m, C, dtype=x.dtype, device=dev)
    size_out = torch.empty(B * m, dtype=torch.float32, device=dev)
    cu_out = torch.empty(B + 1, dtype=torch.int64, device=dev)
    src = torch.empty(B * m, dtype=torch.int64, device=dev)
    key_bias = torch.empty(B * m, dtype=torch.float32, device=dev)
    score = torch.empty(B * n_a, dtype=torch.float32, device=dev)
    np_, warps = merge_launch_config(n_a) if config is None else config
    mod = _default_kernels() if kernels is None else kernels
    mod._ragged_merge[(B,)](
        x, qkv, qkv if qkv_bias is None else qkv_bias, size_out if size is None else size,
        x if skip is None else skip, x if skip_bias is None else skip_bias, x_out, size_out, cu_out, src, key_bias,
        score, n, C, num_heads, head_dim, num_prefix, min(r, n), int(qkv_bias is not None), int(size is not None),
        int(skip is not None), int(skip_bias is not None), int(bool(class_token)), NP=np_,
        BLOCK_D=_head_block(head_dim), BLOCK_A=MERGE_BLOCK_A, BLOCK_B=MERGE_BLOCK_B, BLOCK_M=MERGE_BLOCK_M,
        BLOCK_ROWS=MERGE_BLOCK_ROWS, BLOCK_C=merge_block_c(x.element_size()), num_warps=warps,
    )  # fmt: skip
    return x_out, size_out, cu_out, src, key_bias, score
