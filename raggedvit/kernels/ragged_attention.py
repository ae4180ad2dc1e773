"""Public ragged attention op (TEMPORARY: reference-only until the Triton path lands)."""

from __future__ import annotations

import torch

from raggedvit.kernels.reference import ragged_attention_reference

__all__ = ["ragged_attention"]


def ragged_attention(
    qkv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    num_heads: int,
    *,
    scale: float | None = None,
    max_seqlen: int | None = None,
    return_cls_attn: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """qkv [T, 3*H*D], cu_seqlens [B+1] -> out [T, H*D] (and cls_attn [T] float32)."""
    return ragged_attention_reference(qkv, cu_seqlens, num_heads, scale=scale, return_cls_attn=return_cls_attn)
