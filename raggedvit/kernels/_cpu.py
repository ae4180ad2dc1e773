"""CPU implementation of ragged attention: batched SDPA over groups of similar-length sequences.

Sequences are sorted by length and cut into groups whose longest member is at most 25% (or 8 tokens)
longer than the shortest, so padding stays small; a group of equal lengths runs without a mask.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from raggedvit.kernels.reference import relative_position_index

__all__ = ["ragged_attention_cpu"]


def _groups(lengths: list[int]) -> list[list[int]]:
    """Indices of non-empty sequences, grouped by similar length (ascending)."""
    order = sorted((n, b) for b, n in enumerate(lengths) if n > 0)
    groups: list[list[int]] = []
    low = -1
    for n, b in order:
        if not groups or n > max(low * 1.25, low + 8):
            groups.append([])
            low = n
        groups[-1].append(b)
    return groups


def ragged_attention_cpu(
    qkv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    num_heads: int,
    scale: float,
    return_cls_attn: bool,
    *,
    bias: torch.Tensor | None = None,
    pos_table: torch.Tensor | None = None,
    token_pos: torch.Tensor | None = None,
    grid: tuple[int, int] = (0, 0),
    num_prefix: int = 0,
    key_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """qkv [T, 3*H*D] contiguous, cu_seqlens [B+1] (host) (, bias [3*H*D] qkv's dtype: attention of qkv + bias)
    (, pos_table [H, R] fp32 and token_pos [T]: relative position bias, DESIGN.md section 1)
    (, key_bias [T] fp32: added to every score of that key, DESIGN.md section 1)
    -> out [T, H*D] qkv.dtype, cls_attn [T] fp32 (or [0]).

    Computes in float32 for half inputs. cu_seqlens must be valid (checked: 0 = cu[0] <= ... <= cu[B] <= T);
    rows >= cu[B] are dead (the capacity layout, DESIGN.md section 4): out and cls_attn are zero there.
    With pos_table, each group's bias [G, H, L, L] is gathered from the table (this path is the CPU fallback;
    the kernels compute the index per pair instead).
    """
    T, width = qkv.shape
    H = num_heads
    D = width // (3 * H)
    cu = cu_seqlens.to(torch.int64)
    if cu.numel() == 0 or int(cu[0]) != 0 or int(cu[-1]) > T or bool((cu[1:] < cu[:-1]).any()):
        raise ValueError(f"cu_seqlens must rise from 0 to at most T={T}, got {cu.tolist()[:16]}")
    live = int(cu[-1])
    if bias is not None:
        qkv = qkv + bias
    compute = torch.float32 if qkv.dtype in (torch.float16, torch.bfloat16) else qkv.dtype
    out = qkv.new_empty((T, H * D)) if live == T else qkv.new_zeros((T, H * D))
    dev = qkv.device
    cls_attn = torch.zeros(T if return_cls_attn else 0, dtype=torch.float32, device=dev)
    starts = cu[:-1].tolist()
    lengths = (cu[1:] - cu[:-1]).tolist()
    x = qkv.reshape(T, 3, H, D)
    for group in _groups(lengths):
        n = torch.tensor([lengths[b] for b in group], device=dev)  # [G]
        L = int(n.max())
        rows = torch.tensor([starts[b] for b in group], device=dev)[:, None] + torch.arange(L, device=dev)[None, :]
        valid = torch.arange(L, device=dev)[None, :] < n[:, None]  # [G, L]
        rows = torch.where(valid, rows, rows[:, :1])  # padding rows repeat the first row (masked as keys)
        q, k, v = x[rows].to(compute).permute(2, 0, 3, 1, 4).unbind(0)  # each [G, H, L, D]
        mask = None if bool(valid.all()) else valid[:, None, None, :]
        pos = None
        if pos_table is not None:
            idx = relative_position_index(token_pos[rows], token_pos[rows], grid, num_prefix)  # [G, L, L]
            pos = pos_table.to(compute)[:, idx].transpose(0, 1)  # [G, H, L, L]
            if mask is not None:
                pos = pos.masked_fill(~mask, float("-inf"))
            mask = pos
        if key_bias is not None:
            kb = key_bias.to(compute)[rows][:, None, None, :]  # [G, 1, 1, L]
            mask = kb if pos is None else pos + kb  # a float mask: padding keys -inf
            if not bool(valid.all()):
                mask = mask.masked_fill(~valid[:, None, None, :], float("-inf"))
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)  # [G, H, L, D]
        o = o.permute(0, 2, 1, 3).reshape(len(group) * L, H * D)[valid.flatten()]
        out[rows[valid]] = o.to(qkv.dtype)
        if return_cls_attn:
            s = torch.einsum("ghd,ghkd->ghk", q[:, :, 0], k) * scale  # [G, H, L]
            if pos is not None:
                s = s + pos[:, :, 0]  # padding keys already -inf
            if key_bias is not None:
                s = s + kb[:, :, 0]
            if not bool(valid.all()):
                s = s.masked_fill(~valid[:, None, :], float("-inf"))
            cls_attn[rows[valid]] = torch.softmax(s, dim=-1).mean(1)[valid].to(torch.float32)
    return out, cls_attn
