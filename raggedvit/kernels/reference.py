"""Torch reference for ragged (packed, variable-length) bidirectional attention.

The reference defines the semantics every implementation must match (Triton
kernel, ORT CPU kernel, ORT CUDA kernel). It loops over sequences, so it is
exact and simple rather than fast; it runs in any dtype, float64 included.
"""

from __future__ import annotations

import math

import torch

__all__ = ["ragged_attention_reference"]


def ragged_attention_reference(
    qkv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    num_heads: int,
    *,
    scale: float | None = None,
    return_cls_attn: bool = False,
    compute_dtype: torch.dtype | None = None,
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
    x = qkv.to(compute_dtype).reshape(T, 3, H, D)
    out = torch.zeros(T, H * D, dtype=compute_dtype, device=qkv.device)
    cls = torch.zeros(T, dtype=compute_dtype, device=qkv.device)
    bounds = [int(b) for b in cu_seqlens.tolist()]
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end <= start:
            continue
        q, k, v = x[start:end].unbind(1)  # each [L, H, D]
        s = torch.einsum("qhd,khd->hqk", q, k) * scale
        p = torch.softmax(s, dim=-1)  # [H, L, L]
        out[start:end] = torch.einsum("hqk,khd->qhd", p, v).reshape(end - start, H * D)
        cls[start:end] = p[:, 0, :].mean(0)
    out = out.to(qkv.dtype)
    if return_cls_attn:
        return out, cls.to(torch.float32) if compute_dtype != torch.float64 else cls
    return out
