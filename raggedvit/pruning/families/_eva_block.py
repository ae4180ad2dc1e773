"""One timm Eva block (`EvaBlock` / `EvaBlockPostNorm` with `EvaAttention` / `AttentionRope`) on packed rows."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import AttentionRope
from timm.models.eva import EvaAttention, EvaBlock, EvaBlockPostNorm
from torch import nn

from raggedvit.kernels import ragged_attention
from raggedvit.pruning.backbone import AttentionFn, module_dtype
from raggedvit.pruning.rope import apply_packed_rope

__all__ = ["BLOCKS", "ATTENTIONS", "eva_attention", "eva_block_forward"]

BLOCKS = (EvaBlock, EvaBlockPostNorm)
ATTENTIONS = (EvaAttention, AttentionRope)


def _qkv_bias(attn: nn.Module) -> torch.Tensor | None:
    """The fused qkv projection's bias [3*H*D] (EvaAttention: q_bias | k_bias (zeros) | v_bias), or None."""
    if getattr(attn, "q_bias", None) is not None:
        return torch.cat((attn.q_bias, attn.k_bias, attn.v_bias))
    return attn.qkv.bias


def _is_identity(module: nn.Module) -> bool:
    return isinstance(module, nn.Identity)


def eva_attention(
    attn: nn.Module,
    h: torch.Tensor,
    cu_seqlens: torch.Tensor,
    rope: torch.Tensor | None,
    *,
    max_seqlen: int,
    return_cls_attn: bool,
    attention: AttentionFn | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Eva attention on packed rows up to the merged heads (before the sub-LN `attn.norm`, the gate and proj).

    Args:
        attn: timm EvaAttention or AttentionRope (fused or separate q/k/v projections, q/v bias, qk norm,
            grouped k/v heads).
        h: [T, C] the attention input (norm1's output; the block input for post-norm blocks).
        cu_seqlens: [B+1] int64.
        rope: [T, 1 or H, 2D] each row's sin | cos (raggedvit.pruning.rope.rope_rows), None without rope.
        max_seqlen, return_cls_attn, attention: as `packed_block_forward`.

    Returns:
        (o [T, H*D] in the attention's dtype, cls_attn [T] float32 or None).
    """
    T = h.shape[0]
    H, D = attn.num_heads, attn.head_dim
    kv_heads = getattr(attn, "num_kv_heads", H)
    hc = h.to(module_dtype(attn, h.dtype))
    kwargs = {"scale": attn.scale, "max_seqlen": max_seqlen, "return_cls_attn": return_cls_attn}
    plain = rope is None and _is_identity(attn.q_norm) and _is_identity(attn.k_norm)
    if attn.qkv is not None and plain and attention is None:
        # the qkv bias rides into the op (added on load), as in the ViT block
        res = ragged_attention(F.linear(hc, attn.qkv.weight), cu_seqlens, H, bias=_qkv_bias(attn), **kwargs)
    else:
        if attn.qkv is not None:
            q, k, v = F.linear(hc, attn.qkv.weight, _qkv_bias(attn)).reshape(T, 3, H, D).unbind(1)
        else:
            q = attn.q_proj(hc).reshape(T, H, D)
            k = attn.k_proj(hc).reshape(T, kv_heads, D)
            v = attn.v_proj(hc).reshape(T, kv_heads, D)
        q, k = attn.q_norm(q), attn.k_norm(k)
        if rope is not None:
            q = apply_packed_rope(q, rope, half=attn.rotate_half).type_as(v)
            k = apply_packed_rope(k, rope, half=attn.rotate_half).type_as(v)
        if kv_heads != H:  # grouped-query attention: head j reads k/v head j // (H / kv_heads), as timm
            k = k.repeat_interleave(H // kv_heads, dim=1)
            v = v.repeat_interleave(H // kv_heads, dim=1)
        qkv = torch.cat((q, k, v), dim=1).reshape(T, 3 * H * D)  # row t = q(h, d) | k | v
        res = (attention or ragged_attention)(qkv, cu_seqlens, H, **kwargs)
    return res if return_cls_attn else (res, None)


def eva_block_forward(
    block: nn.Module,
    x: torch.Tensor,
    cu_seqlens: torch.Tensor,
    rope: torch.Tensor | None,
    *,
    max_seqlen: int,
    return_cls_attn: bool = False,
    attention: AttentionFn | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """timm EvaBlock / EvaBlockPostNorm forward on packed rows.

    Args:
        block: the block (eval mode).
        x: [T, C] packed rows (the residual stream, in norm1's dtype); sequence b is rows [cu[b], cu[b+1]).
        cu_seqlens: [B+1] int64.
        rope: [T, 1 or H, 2D] the rows' rotary sin | cos, or None.
        max_seqlen, return_cls_attn, attention: as `raggedvit.pruning.packed_block.packed_block_forward`.

    Returns:
        x' [T, C] (and cls_attn [T] float32).
    """
    x, cls_attn = eva_attend(
        block, x, cu_seqlens, rope, max_seqlen=max_seqlen, return_cls_attn=return_cls_attn, attention=attention
    )
    x = eva_feed_forward(block, x)
    return (x, cls_attn) if return_cls_attn else x


def eva_attend(
    block: nn.Module,
    x: torch.Tensor,
    cu_seqlens: torch.Tensor,
    rope: torch.Tensor | None,
    *,
    max_seqlen: int,
    return_cls_attn: bool = False,
    attention: AttentionFn | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The attention half of eva_block_forward: (x + gamma_1 * attn(norm1(x)), or x + norm1(attn(x)) post-norm,
    [T, C]; cls_attn [T] float32 or None). Arguments as eva_block_forward."""
    attn = block.attn
    post = isinstance(block, EvaBlockPostNorm)
    h = x if post else block.norm1(x)
    o, cls_attn = eva_attention(
        attn, h, cu_seqlens, rope, max_seqlen=max_seqlen, return_cls_attn=return_cls_attn, attention=attention
    )
    o = attn.norm(o)
    if attn.gate is not None:
        o = o * attn.gate(h.to(o.dtype)).sigmoid()
    o = attn.proj_drop(attn.proj(o))
    if post:
        return x + block.drop_path1(block.norm1(o.to(module_dtype(block.norm1, x.dtype))).to(x.dtype)), cls_attn
    o = o.to(x.dtype)
    if block.gamma_1 is not None:
        o = block.gamma_1 * o
    return x + block.drop_path1(o), cls_attn


def eva_feed_forward(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The MLP half of eva_block_forward: x + gamma_2 * mlp(norm2(x)), or x + norm2(mlp(x)) post-norm."""
    if isinstance(block, EvaBlockPostNorm):
        m = block.mlp(x.to(module_dtype(block.mlp, x.dtype)))
        return x + block.drop_path2(block.norm2(m.to(module_dtype(block.norm2, x.dtype))).to(x.dtype))
    h2 = block.norm2(x)
    m = block.mlp(h2.to(module_dtype(block.mlp, h2.dtype))).to(x.dtype)
    if block.gamma_2 is not None:
        m = block.gamma_2 * m
    return x + block.drop_path2(m)
