"""CPU implementation of ragged attention: one padded, batched SDPA (vectorised over sequences)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["ragged_attention_cpu"]


def ragged_attention_cpu(
    qkv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    num_heads: int,
    scale: float,
    return_cls_attn: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """qkv [T, 3*H*D], cu_seqlens [B+1] (host) -> out [T, H*D] qkv.dtype, cls_attn [T] fp32 (or [0]).

    Computes in float32 for half inputs. cu_seqlens must be valid (checked: 0 = cu[0] <= ... <= cu[B] = T).
    """
    T, width = qkv.shape
    H = num_heads
    D = width // (3 * H)
    cu = cu_seqlens.to(torch.int64)
    if cu.numel() == 0 or int(cu[0]) != 0 or int(cu[-1]) != T or bool((cu[1:] < cu[:-1]).any()):
        raise ValueError(f"cu_seqlens must rise from 0 to T={T}, got {cu.tolist()[:16]}")
    compute = torch.float32 if qkv.dtype in (torch.float16, torch.bfloat16) else qkv.dtype
    cls_attn = torch.zeros(T if return_cls_attn else 0, dtype=torch.float32)
    if T == 0:
        return qkv.new_empty((0, H * D)), cls_attn
    lengths = cu[1:] - cu[:-1]
    B = lengths.numel()
    L = int(lengths.max())
    seq_id = torch.repeat_interleave(torch.arange(B), lengths)  # [T]
    pos = torch.arange(T) - cu[:-1][seq_id]  # [T]
    padded = qkv.new_zeros((B, L, 3, H, D), dtype=compute)
    padded[seq_id, pos] = qkv.reshape(T, 3, H, D).to(compute)
    q, k, v = padded.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, H, L, D]
    key_ok = torch.arange(L)[None, :] < lengths[:, None]  # [B, L]
    mask = key_ok[:, None, None, :]  # [B, 1, 1, L]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)  # [B, H, L, D]
    out = out.permute(0, 2, 1, 3)[seq_id, pos].reshape(T, H * D).to(qkv.dtype)
    if return_cls_attn:
        s = torch.einsum("bhd,bhkd->bhk", q[:, :, 0], k) * scale  # [B, H, L]
        p = torch.softmax(s.masked_fill(~key_ok[:, None, :], float("-inf")), dim=-1)
        cls_attn = p.mean(1)[seq_id, pos].to(torch.float32)
    return out, cls_attn
