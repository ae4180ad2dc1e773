"""Torch references for ragged (packed, variable-length) bidirectional attention and the ragged linear layer.

The reference defines the semantics every implementation must match (Triton
kernel, ORT CPU kernel, ORT CUDA kernel). It loops over sequences, so it is
exact and simple rather than fast; it runs in any dtype, float64 included.

Relative position bias (DESIGN.md section 1): each packed row carries its ORIGINAL token index t within its
image (`token_pos`); with p prefix tokens and a grid_h x grid_w patch grid, a row is a patch row iff
p <= t < p + grid_h*grid_w, at (y, x) = divmod(t - p, grid_w); every other row (prefix, an evit fused token
with t = -1, any out-of-range t) is a class row. `relative_position_index` gives BEiT's index of a
(query, key) pair into a per-head table of R = (2*grid_h-1)*(2*grid_w-1) + 3 entries.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "live_rows",
    "pos_table_size",
    "ragged_attention_reference",
    "ragged_linear_reference",
    "relative_position_index",
]


def pos_table_size(grid: tuple[int, int]) -> int:
    """R = (2*grid_h-1)*(2*grid_w-1) + 3: the relative offsets, then class->patch, patch->class, class->class."""
    gh, gw = grid
    return (2 * gh - 1) * (2 * gw - 1) + 3


def relative_position_index(
    token_pos_q: torch.Tensor, token_pos_k: torch.Tensor, grid: tuple[int, int], num_prefix: int
) -> torch.Tensor:
    """[..., Lq] x [..., Lk] original token indices (any integer values) -> [..., Lq, Lk] int64 indices in [0, R).

    patch q, patch k: (yq - yk + gh - 1) * (2*gw - 1) + (xq - xk + gw - 1) (timm's gen_relative_position_index,
    query minus key); class q, patch k: R-3; patch q, class k: R-2; class q, class k: R-1.
    """
    gh, gw = grid
    R = pos_table_size(grid)

    def split(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        t = t.to(torch.int64)
        patch = (t >= num_prefix) & (t < num_prefix + gh * gw)
        rel = torch.where(patch, t - num_prefix, 0)
        return patch, rel // gw, rel % gw

    pq, yq, xq = split(token_pos_q)
    pk, yk, xk = split(token_pos_k)
    both = (yq[..., :, None] - yk[..., None, :] + gh - 1) * (2 * gw - 1) + (
        xq[..., :, None] - xk[..., None, :] + gw - 1
    )
    pq, pk = pq[..., :, None], pk[..., None, :]
    cls_q = torch.where(pk, R - 3, R - 1)
    return torch.where(pq, torch.where(pk, both, R - 2), cls_q)


def ragged_attention_reference(
    qkv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    num_heads: int,
    *,
    scale: float | None = None,
    return_cls_attn: bool = False,
    compute_dtype: torch.dtype | None = None,
    pos_table: torch.Tensor | None = None,
    token_pos: torch.Tensor | None = None,
    grid: tuple[int, int] | None = None,
    num_prefix: int = 0,
    key_bias: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention within each packed sequence.

    Args:
        qkv: [T, 3*H*D] timm's qkv Linear output (q, k, v blocks, head-major).
        cu_seqlens: [B+1] int32/int64, 0 = cu[0] <= cu[1] <= ... <= cu[B] <= T; rows >= cu[B] are dead
            (out and cls_attn zero there).
        num_heads: H.
        scale: softmax scale, default 1/sqrt(D).
        return_cls_attn: also return cls_attn.
        compute_dtype: dtype of the arithmetic (default: float32 for half
            inputs, else the input dtype; pass torch.float64 for a gold reference).
        pos_table: optional [H, R] relative position bias table, R = pos_table_size(grid); logits are
            scale * q.k + pos_table[h, relative_position_index(token_pos[q], token_pos[k])].
        token_pos: [T] each row's original token index (needed with pos_table).
        grid: (grid_h, grid_w) patch grid (needed with pos_table).
        num_prefix: prefix tokens p (before the patches in token index order).
        key_bias: optional [T] per-key bias (float32): logit(q, k) += key_bias[k] in every head, cls_attn included
            (ToMe's proportional attention passes log(size)).

    Returns:
        out [T, H*D] in qkv.dtype, and if requested cls_attn [T] float32: for
        every token, the mean over heads of the attention its sequence's first
        token pays to it.
    """
    T, width = qkv.shape
    H = num_heads
    D = width // (3 * H)
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    if compute_dtype is None:
        compute_dtype = torch.float32 if qkv.dtype in (torch.float16, torch.bfloat16) else qkv.dtype
    if pos_table is not None and (token_pos is None or grid is None):
        raise ValueError("pos_table needs token_pos and grid")
    x = qkv.to(compute_dtype).reshape(T, 3, H, D)
    out = torch.zeros(T, H * D, dtype=compute_dtype, device=qkv.device)
    cls = torch.zeros(T, dtype=compute_dtype, device=qkv.device)
    bounds = [int(b) for b in cu_seqlens.tolist()]
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end <= start:
            continue
        q, k, v = x[start:end].unbind(1)  # each [L, H, D]
        s = torch.einsum("qhd,khd->hqk", q, k) * scale
        if pos_table is not None:
            tp = token_pos[start:end]
            idx = relative_position_index(tp, tp, grid, num_prefix)  # [L, L]
            s = s + pos_table.to(compute_dtype)[:, idx]  # [H, L, L]
        if key_bias is not None:
            s = s + key_bias[start:end].to(compute_dtype)  # per key, every head and query
        p = torch.softmax(s, dim=-1)  # [H, L, L]
        out[start:end] = torch.einsum("hqk,khd->qhd", p, v).reshape(end - start, H * D)
        cls[start:end] = p[:, 0, :].mean(0)
    out = out.to(qkv.dtype)
    if return_cls_attn:
        return out, cls.to(torch.float32) if compute_dtype != torch.float64 else cls
    return out


def live_rows(T: int, cu_seqlens: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """[T] bool: row r < live, live = clamp(cu[B], 0, T) (T without cu_seqlens). Computed on the device: no host
    read of cu_seqlens."""
    rows = torch.arange(T, device=device)
    if cu_seqlens is None:
        return torch.ones(T, dtype=torch.bool, device=device)
    return rows < cu_seqlens[-1].to(device=device, dtype=torch.int64).clamp(0, T)


def ragged_linear_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    activation: int = 0,
    *,
    compute_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """y[r] = act(x[r] @ weight^T + bias) + residual[r] for the live rows r < live, 0 for the dead rows (the op
    leaves them unspecified: its Triton kernel never writes them).

    Args:
        x: [T, K]; weight: [N, K] (nn.Linear's layout); bias: [N] or None; residual: [T, N] or None.
        cu_seqlens: [B+1] int32/int64 or None; live = clamp(cu[B], 0, T), or T without it.
        activation: 0 none, 1 GELU (erf).
        compute_dtype: dtype of the arithmetic (default: float32 for half inputs, else x's dtype; torch.float64
            for a gold reference). The result is rounded to x's dtype once, at the end.

    Returns:
        y [T, N] in x's dtype (compute_dtype when that is float64).
    """
    if activation not in (0, 1):
        raise ValueError(f"activation must be 0 (none) or 1 (GELU), got {activation}")
    if compute_dtype is None:
        compute_dtype = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    cd = compute_dtype
    y = torch.nn.functional.linear(x.to(cd), weight.to(cd), None if bias is None else bias.to(cd))
    if activation == 1:
        y = torch.nn.functional.gelu(y)
    if residual is not None:
        y = y + residual.to(cd)
    y = torch.where(live_rows(x.shape[0], cu_seqlens, x.device)[:, None], y, 0.0)
    return y if cd == torch.float64 else y.to(x.dtype)
