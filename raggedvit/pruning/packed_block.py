"""One timm `Block` on packed rows [T, C] with the ragged attention op (opt-in: the ragged linear op)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import DropPath, Mlp
from timm.models.vision_transformer import Block
from torch import nn

from raggedvit.kernels import ragged_attention
from raggedvit.kernels import ragged_linear as fused_linear
from raggedvit.pruning.backbone import Attended, AttentionFn, module_dtype
from raggedvit.pruning.merge_op import MergeKeys

__all__ = [
    "AttentionFn",
    "Attended",
    "attn_residual",
    "block_tail",
    "mlp_residual",
    "packed_attend",
    "packed_block_forward",
    "packed_feed_forward",
    "ragged_tail",
]


def _apply_qk_norm(qkv: torch.Tensor, q_norm: nn.Module, k_norm: nn.Module, heads: int, dim: int) -> torch.Tensor:
    """qkv [T, 3*H*D] -> same layout with q_norm / k_norm applied per head (timm's qk_norm)."""
    T = qkv.shape[0]
    q, k, v = qkv.reshape(T, 3, heads, dim).unbind(1)  # each [T, H, D]
    return torch.stack((q_norm(q), k_norm(k), v), dim=1).reshape(T, 3 * heads * dim)


def _attention(
    block: Block,
    x: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    max_seqlen: int,
    return_cls_attn: bool,
    attention: AttentionFn | None,
    ragged_linear: bool,
    key_bias: torch.Tensor | None,
    metric: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """norm1, qkv and the attention of `block` on packed rows: (h = norm1(x) [T, C], o [T, H*D] heads merged,
    cls_attn [T] or None, MergeKeys (tome's metric: qkv, the qkv bias not yet in it, H) or None). Arguments as
    packed_block_forward."""
    if type(block) is not Block:
        raise TypeError(f"packed_block_forward supports timm's Block only, got {type(block).__name__}")
    attn = block.attn
    h = block.norm1(x)
    hc = h.to(attn.qkv.weight.dtype)
    qk_norm = not (isinstance(attn.q_norm, nn.Identity) and isinstance(attn.k_norm, nn.Identity))
    kwargs = {"scale": attn.scale, "max_seqlen": max_seqlen, "return_cls_attn": return_cls_attn}
    if key_bias is not None:
        kwargs["key_bias"] = key_bias
    if attention is None and not qk_norm:
        # the qkv bias rides into the op (added on load): one elementwise pass over [T, 3C] fewer
        if ragged_linear:
            qkv = fused_linear(hc, attn.qkv.weight, cu_seqlens=cu_seqlens)
        else:
            qkv = F.linear(hc, attn.qkv.weight)
        res = ragged_attention(qkv, cu_seqlens, attn.num_heads, bias=attn.qkv.bias, **kwargs)
        keys = MergeKeys(qkv, attn.qkv.bias, attn.num_heads) if metric else None
    else:
        if ragged_linear:
            qkv = fused_linear(hc, attn.qkv.weight, attn.qkv.bias, cu_seqlens=cu_seqlens)
        else:
            qkv = attn.qkv(hc)
        if qk_norm:
            qkv = _apply_qk_norm(qkv, attn.q_norm, attn.k_norm, attn.num_heads, attn.head_dim)
        res = (attention or ragged_attention)(qkv.contiguous(), cu_seqlens, attn.num_heads, **kwargs)
        keys = MergeKeys(qkv, None, attn.num_heads) if metric else None
    o, cls_attn = res if return_cls_attn else (res, None)
    return h, o, cls_attn, keys


def packed_attend(
    block: Block,
    x: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    max_seqlen: int,
    return_cls_attn: bool = False,
    attention: AttentionFn | None = None,
    ragged_linear: bool = False,
    key_bias: torch.Tensor | None = None,
    metric: bool = False,
) -> Attended:
    """The first half of timm's Block on packed rows: x [T, C] -> Attended (x + ls1(proj(attention(norm1(x)))),
    and the block's cls_attn and key metric when asked). An in-block stage (tome's merge, evit's pruning) runs on
    it, then `packed_feed_forward` on the rows it leaves. Arguments as packed_block_forward; every row is live."""
    h, o, cls_attn, keys = _attention(
        block, x, cu_seqlens, max_seqlen=max_seqlen, return_cls_attn=return_cls_attn, attention=attention,
        ragged_linear=ragged_linear, key_bias=key_bias, metric=metric,
    )  # fmt: skip
    if ragged_linear:
        x = _ragged_attn_residual(block, x, h, o, cu_seqlens)
    else:
        x = attn_residual(block, x, h, o)
    return Attended(x, cls_attn, keys)


def packed_feed_forward(
    block: Block, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None, *, ragged_linear: bool = False
) -> torch.Tensor:
    """The second half of timm's Block on packed rows: x [T, C] -> x + ls2(mlp(norm2(x))). cu_seqlens (with
    ragged_linear): rows past cu[B] are dead and not computed; None: every row is live."""
    if ragged_linear:
        return _ragged_mlp_residual(block, x, cu_seqlens)
    return mlp_residual(block, x)


def packed_block_forward(
    block: Block,
    x: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    max_seqlen: int,
    return_cls_attn: bool = False,
    attention: AttentionFn | None = None,
    ragged_linear: bool = False,
    out_rows: tuple[torch.Tensor, torch.Tensor] | None = None,
    key_bias: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """timm Block.forward on packed sequences.

    Args:
        block: a timm `Block` whose attention is timm's `Attention` (eval mode).
        x: [T, C] packed rows (the residual stream, in norm1's dtype); sequence b is rows [cu[b], cu[b+1]).
        cu_seqlens: [B+1] int64.
        max_seqlen: static upper bound of the sequence lengths.
        return_cls_attn: also return cls_attn [T] float32 (attention each sequence's first row pays to each row,
            mean over heads).
        attention: another implementation of `ragged_attention` (same signature and semantics), e.g. a
            benchmark peer; None uses raggedvit's op, which also takes the qkv bias (no separate add).
        ragged_linear: run the block's GEMMs with `raggedvit.kernels.ragged_linear` over the live rows
            [0, cu[B]) (dead rows of the capacity layout: unspecified), bias / GELU / residual fused where the block
            allows it (`ragged_tail`); False: nn.Linear / F.linear on every row.
        out_rows: (rows [R] int64, cu [B+1] int64 of those rows) or None: every row attends as usual, then the
            rest of the block (proj, residual, norm2, MLP: all per row) runs on `rows` alone (the rows a token-pooling
            head reads, after the last block). Not with return_cls_attn.
        key_bias: optional [T] float32 added to every attention score of its key (ToMe's proportional attention:
            log of each row's size).

    Returns:
        x' [T, C] ([R, C] with out_rows) (and cls_attn [T] float32).
    """
    if out_rows is not None and return_cls_attn:
        raise ValueError("out_rows and return_cls_attn exclude each other")
    h, o, cls_attn, _ = _attention(
        block, x, cu_seqlens, max_seqlen=max_seqlen, return_cls_attn=return_cls_attn, attention=attention,
        ragged_linear=ragged_linear, key_bias=key_bias, metric=False,
    )  # fmt: skip
    if out_rows is not None:
        rows, cu_seqlens = out_rows
        x, h, o = x.index_select(0, rows), h.index_select(0, rows), o.index_select(0, rows)
    x = ragged_tail(block, x, h, o, cu_seqlens) if ragged_linear else block_tail(block, x, h, o)
    return (x, cls_attn) if return_cls_attn else x


def block_tail(block: Block, x: torch.Tensor, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """The rest of timm's Block after attention, for any row layout ([T, C] packed or [B, W, C] padded).

    x: the block input (residual stream dtype); h: norm1(x) (the attention gate reads it); o: attention output,
    heads merged ([..., H*D], in the attention's dtype). Each submodule runs in its own dtype (module_dtype)."""
    return mlp_residual(block, attn_residual(block, x, h, o))


def attn_residual(block: Block, x: torch.Tensor, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """The first half of `block_tail`: x + ls1(proj(gate(attn.norm(o)))) (the residual stream after the attention,
    where a tome stage merges)."""
    attn = block.attn
    o = attn.norm(o)
    if getattr(attn, "gate", None) is not None:
        o = o * attn.gate(h.to(o.dtype)).sigmoid()
    o = attn.proj_drop(attn.proj(o))
    return x + block.drop_path1(block.ls1(o.to(x.dtype)))


def mlp_residual(block: Block, x: torch.Tensor) -> torch.Tensor:
    """The second half of `block_tail`: x + ls2(mlp(norm2(x)))."""
    h2 = block.norm2(x)
    m = block.mlp(h2.to(module_dtype(block.mlp, h2.dtype)))
    return x + block.drop_path2(block.ls2(m.to(x.dtype)))


def _inert(module: nn.Module) -> bool:
    """True for a module that returns its input at inference: nn.Identity, Dropout / DropPath in eval mode."""
    if isinstance(module, nn.Identity):
        return True
    return isinstance(module, (nn.Dropout, DropPath)) and not module.training


def _plain_mlp(mlp: nn.Module) -> bool:
    """timm's Mlp as fc1 -> act -> fc2 (Linear layers, no hidden norm, inert dropouts)."""
    return (
        type(mlp) is Mlp
        and isinstance(mlp.fc1, nn.Linear)
        and isinstance(mlp.fc2, nn.Linear)
        and all(_inert(m) for m in (mlp.drop1, mlp.norm, mlp.drop2))
    )


def ragged_tail(block: Block, x: torch.Tensor, h: torch.Tensor, o: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    """`block_tail` on packed rows [T, C] with the ragged linear op (rows past cu[B] are dead: not computed).

    attn.proj: bias and the residual add fused when nothing sits between proj and the add (no attn.norm, gate,
    ls1, drop_path1) and x has proj's dtype (the fp16-all / fp32 recipes); else the op with the bias, then the
    add as block_tail. MLP (timm's Mlp with Linear layers only, else block.mlp as block_tail): fc1 with the bias
    and nn.GELU (erf) fused, fc2 with the bias and the residual under the same conditions as proj. The
    op's dead rows are unspecified (x's dead rows are never read: DESIGN.md section 4)."""
    return _ragged_mlp_residual(block, _ragged_attn_residual(block, x, h, o, cu), cu)


def _ragged_attn_residual(
    block: Block, x: torch.Tensor, h: torch.Tensor, o: torch.Tensor, cu: torch.Tensor | None
) -> torch.Tensor:
    """The attention half of `ragged_tail` (`attn_residual` with the ragged linear op)."""
    attn, proj = block.attn, block.attn.proj
    gate = getattr(attn, "gate", None)
    if not isinstance(proj, nn.Linear):
        return attn_residual(block, x, h, o)
    if (
        gate is None
        and all(_inert(m) for m in (attn.norm, attn.proj_drop, block.ls1, block.drop_path1))
        and x.dtype == proj.weight.dtype
    ):
        x = fused_linear(o.to(x.dtype), proj.weight, proj.bias, x, cu)
    else:
        o = attn.norm(o)
        if gate is not None:
            o = o * attn.gate(h.to(o.dtype)).sigmoid()
        o = attn.proj_drop(fused_linear(o.to(proj.weight.dtype), proj.weight, proj.bias, cu_seqlens=cu))
        x = x + block.drop_path1(block.ls1(o.to(x.dtype)))
    return x


def _ragged_mlp_residual(block: Block, x: torch.Tensor, cu: torch.Tensor | None) -> torch.Tensor:
    """The MLP half of `ragged_tail` (`mlp_residual` with the ragged linear op; cu None: every row live)."""
    h2 = block.norm2(x)
    mlp = block.mlp
    if not _plain_mlp(mlp):
        m = mlp(h2.to(module_dtype(mlp, h2.dtype)))
        return x + block.drop_path2(block.ls2(m.to(x.dtype)))
    fc1, fc2 = mlp.fc1, mlp.fc2
    gelu = isinstance(mlp.act, nn.GELU) and mlp.act.approximate == "none"
    a = fused_linear(h2.to(fc1.weight.dtype), fc1.weight, fc1.bias, cu_seqlens=cu, activation=int(gelu))
    if not gelu:
        a = mlp.act(a)
    a = a.to(fc2.weight.dtype)
    if _inert(block.ls2) and _inert(block.drop_path2) and x.dtype == fc2.weight.dtype:
        return fused_linear(a, fc2.weight, fc2.bias, x, cu)
    m = fused_linear(a, fc2.weight, fc2.bias, cu_seqlens=cu)
    return x + block.drop_path2(block.ls2(m.to(x.dtype)))
