"""One timm `Block` on packed rows [T, C] with the ragged attention op."""

from __future__ import annotations

from collections.abc import Callable

import torch
from timm.models.vision_transformer import Block
from torch import nn

from raggedvit.kernels import ragged_attention

__all__ = ["AttentionFn", "block_tail", "packed_block_forward"]

# Same signature and semantics as raggedvit.kernels.ragged_attention (DESIGN.md section 1):
# (qkv [T, 3*H*D], cu_seqlens [B+1], num_heads, *, scale, max_seqlen, return_cls_attn)
#   -> out [T, H*D] or (out, cls_attn [T] float32)
AttentionFn = Callable[..., "torch.Tensor | tuple[torch.Tensor, torch.Tensor]"]


def _apply_qk_norm(qkv: torch.Tensor, q_norm: nn.Module, k_norm: nn.Module, heads: int, dim: int) -> torch.Tensor:
    """qkv [T, 3*H*D] -> same layout with q_norm / k_norm applied per head (timm's qk_norm)."""
    T = qkv.shape[0]
    q, k, v = qkv.reshape(T, 3, heads, dim).unbind(1)  # each [T, H, D]
    return torch.stack((q_norm(q), k_norm(k), v), dim=1).reshape(T, 3 * heads * dim)


def packed_block_forward(
    block: Block,
    x: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    max_seqlen: int,
    return_cls_attn: bool = False,
    attention: AttentionFn | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """timm Block.forward on packed sequences.

    Args:
        block: a timm `Block` whose attention is timm's `Attention` (eval mode).
        x: [T, C] packed rows; sequence b is rows [cu[b], cu[b+1]).
        cu_seqlens: [B+1] int64.
        max_seqlen: static upper bound of the sequence lengths.
        return_cls_attn: also return cls_attn [T] float32 (attention each sequence's first row pays to each row,
            mean over heads).
        attention: another implementation of `ragged_attention` (same signature and semantics), e.g. a
            benchmark peer; None uses raggedvit's op.

    Returns:
        x' [T, C] (and cls_attn [T] float32).
    """
    if type(block) is not Block:
        raise TypeError(f"packed_block_forward supports timm's Block only, got {type(block).__name__}")
    attn = block.attn
    h = block.norm1(x)
    qkv = attn.qkv(h)
    if not (isinstance(attn.q_norm, nn.Identity) and isinstance(attn.k_norm, nn.Identity)):
        qkv = _apply_qk_norm(qkv, attn.q_norm, attn.k_norm, attn.num_heads, attn.head_dim)
    attention_fn = ragged_attention if attention is None else attention
    res = attention_fn(
        qkv.contiguous(),
        cu_seqlens,
        attn.num_heads,
        scale=attn.scale,
        max_seqlen=max_seqlen,
        return_cls_attn=return_cls_attn,
    )
    o, cls_attn = res if return_cls_attn else (res, None)
    x = block_tail(block, x, h, o)
    return (x, cls_attn) if return_cls_attn else x


def block_tail(block: Block, x: torch.Tensor, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """The rest of timm's Block after attention, for any row layout ([T, C] packed or [B, W, C] padded).

    x: the block input; h: norm1(x) (the attention gate reads it); o: attention output, heads merged ([..., H*D]).
    """
    attn = block.attn
    o = attn.norm(o)
    if getattr(attn, "gate", None) is not None:
        o = o * attn.gate(h).sigmoid()
    o = attn.proj_drop(attn.proj(o))
    x = x + block.drop_path1(block.ls1(o))
    return x + block.drop_path2(block.ls2(block.mlp(block.norm2(x))))
