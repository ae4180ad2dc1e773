"""One timm transformer Block on packed rows, attention as com.raggedvit::RaggedAttention."""

from __future__ import annotations

from torch import nn

from raggedvit.exporter._builder import GraphBuilder
from raggedvit.exporter.embed import Packed
from raggedvit.exporter.layers import bias_gelu, layer_norm, linear, maybe_layer_norm, to_compute, to_stream
from raggedvit.exporter.metadata import RAGGED_DOMAIN

__all__ = ["RAGGED_DOMAIN", "block", "can_fuse_next_norm"]


def _layer_scale(g: GraphBuilder, x: str, ls: nn.Module, hint: str) -> str:
    if isinstance(ls, nn.Identity):
        return x
    return g.op("Mul", [x, g.weight(ls.gamma, f"{hint}.gamma", dtype=g.stream_dtype)], hint=hint)


def _fusable(layer_scale: nn.Module, norm: nn.Module) -> bool:
    """A residual add (branch without LayerScale) followed by `norm` fits SkipLayerNormalization (affine LayerNorm)."""
    return (
        isinstance(layer_scale, nn.Identity)
        and isinstance(norm, nn.LayerNorm)
        and norm.weight is not None
        and norm.bias is not None
    )


def _can_fuse_skip_ln(blk: nn.Module) -> bool:
    """res1 + norm2 of `blk` fit one SkipLayerNormalization."""
    return _fusable(blk.ls1, blk.norm2)


def can_fuse_next_norm(blk: nn.Module, next_blk: nn.Module) -> bool:
    """fc2 bias + res2 of `blk` and norm1 of `next_blk` fit one SkipLayerNormalization."""
    return _fusable(blk.ls2, next_blk.norm1)


def _skip_ln(g: GraphBuilder, x: str, residual: str, ln: nn.LayerNorm, bias: nn.Parameter | None, hint: str,
             ln_name: str, sum_name: str) -> tuple[str, str]:  # fmt: skip
    """com.microsoft::SkipLayerNormalization in the stream dtype: (ln(x + residual + bias), x + residual + bias)."""
    f32 = g.stream_dtype
    inputs = [
        x,
        residual,
        g.weight(ln.weight, f"{ln_name}.weight", dtype=f32),
        g.weight(ln.bias, f"{ln_name}.bias", dtype=f32),
    ]
    if bias is not None:
        inputs.append(g.weight(bias, f"{hint}.bias", dtype=f32))
    h, total = g.name(ln_name), g.name(sum_name)
    g.op_multi("SkipLayerNormalization", inputs, domain="com.microsoft", hint=hint, outputs=[h, "", "", total],
               epsilon=float(ln.eps))  # fmt: skip
    return h, total


def block(
    g: GraphBuilder,
    blk: nn.Module,
    state: Packed,
    index: int,
    *,
    want_cls_attn: bool,
    normed: str | None = None,
    next_block: nn.Module | None = None,
) -> tuple[str, str | None, str | None]:
    """x [T, C] -> (x [T, C], cls_attn [T] float32 or None, next block's norm1(x) [T, C] or None).

    x = x + ls1(proj(RaggedAttention(qkv(norm1(x)), cu))); x = x + ls2(fc2(gelu(fc1(norm2(x))))).
    x and the norms are float32; qkv .. proj and fc1 .. fc2 run in the GEMM dtype (layers.py: the fp16 recipe).
    `normed`: norm1(x) already computed by the previous block's fused tail. With `next_block` (and
    can_fuse_next_norm), fc2 bias + res2 + next_block.norm1 are one SkipLayerNormalization whose normalised
    output is returned third (the caller passes it on as `normed`).
    """
    p = f"blocks.{index}"
    attn = blk.attn
    C = int(attn.qkv.in_features)
    h = to_compute(g, normed or layer_norm(g, state.x, blk.norm1, f"{p}.norm1", dtype=g.stream_dtype), f"{p}.norm1")
    # the qkv bias rides into RaggedAttention (added on load): one Add kernel per block fewer
    qkv = linear(g, h, attn.qkv, f"{p}.attn.qkv", bias=False)  # [T, 3*H*D]
    attn_in = [qkv, state.cu32]
    if attn.qkv.bias is not None:
        attn_in.append(g.weight(attn.qkv.bias, f"{p}.attn.qkv.bias"))
    out_name = g.name(f"{p}.attn.ragged")
    cls_name = g.name(f"{p}.attn.cls_attn") if want_cls_attn else ""
    g.op_multi(
        "RaggedAttention",
        attn_in,
        domain=RAGGED_DOMAIN,
        hint=f"{p}.attn",
        outputs=[out_name, cls_name] if want_cls_attn else [out_name],
        num_heads=int(attn.num_heads),
        scale=float(attn.scale),
        max_seqlen=int(state.nmax),
    )
    if _can_fuse_skip_ln(blk):
        # proj bias + residual add + norm2 in one com.microsoft::SkipLayerNormalization: one node instead of
        # three, and no bias pass over the proj output (ORT's MatMul+Add -> Gemm broadcasts the bias into the
        # output first: 0.8 ms of 3.6 ms GPU time at deit_base B=32 in the H200 profile of 2026-11-29)
        a = to_stream(g, linear(g, out_name, attn.proj, f"{p}.attn.proj", bias=False), f"{p}.attn.proj")
        h_name, x = _skip_ln(g, a, state.x, blk.norm2, attn.proj.bias, f"{p}.attn.proj", f"{p}.norm2", f"{p}.res1")
        h = to_compute(g, h_name, f"{p}.norm2")
    else:
        a = linear(g, out_name, attn.proj, f"{p}.attn.proj")
        a = _layer_scale(g, to_stream(g, a, f"{p}.attn.proj"), blk.ls1, f"{p}.ls1")
        x = g.op("Add", [state.x, a], hint=f"{p}.res1")
        h = to_compute(g, layer_norm(g, x, blk.norm2, f"{p}.norm2", dtype=g.stream_dtype), f"{p}.norm2")

    mlp = blk.mlp
    h = linear(g, h, mlp.fc1, f"{p}.mlp.fc1", bias=False)
    h = bias_gelu(g, h, mlp.fc1, f"{p}.mlp.fc1")
    h = maybe_layer_norm(g, h, mlp.norm, f"{p}.mlp.norm", dtype=g.compute_dtype)
    assert C == int(mlp.fc2.out_features)
    if next_block is not None and can_fuse_next_norm(blk, next_block):
        # fc2 bias + residual add + the next block's norm1: one node instead of three (bias added in float32)
        h = to_stream(g, linear(g, h, mlp.fc2, f"{p}.mlp.fc2", bias=False), f"{p}.mlp.fc2")
        nxt = f"blocks.{index + 1}.norm1"
        h_next, x = _skip_ln(g, h, x, next_block.norm1, mlp.fc2.bias, f"{p}.mlp.fc2", nxt, f"{p}.res2")
        return x, (cls_name or None), h_next
    h = linear(g, h, mlp.fc2, f"{p}.mlp.fc2")
    h = _layer_scale(g, to_stream(g, h, f"{p}.mlp.fc2"), blk.ls2, f"{p}.ls2")
    x = g.op("Add", [x, h], hint=f"{p}.res2")
    return x, (cls_name or None), None
