"""Patch embedding, prefix tokens and position embedding: images -> packed tokens."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import TensorProto
from torch import nn

from raggedvit.exporter._builder import GraphBuilder
from raggedvit.exporter.layers import float32_to_stream, maybe_layer_norm
from raggedvit.exporter.support import prefix_tokens, tokens_per_image

__all__ = ["Packed", "cu_from_counts", "embed", "patch_embed"]


@dataclass(frozen=True)
class Packed:
    """Packed activations between blocks (tensor names in the graph).

    x [T, C] compute dtype; cu [B+1] int64 (0, cumsum(counts)); counts [B] int64;
    cu32 [B+1] int32 (the RaggedAttention input); nmax: static max rows per image; uniform: the rows of
    every image when all images have the same count known at export time (before any pruning, and after
    topk-l2/evit stages on such a state), else None. A uniform state is pruned with static shapes only
    (TopK + GatherND, no NonZero): no host synchronisation, and the graph can be captured as a CUDA graph.
    """

    x: str
    cu: str
    cu32: str
    counts: str
    nmax: int
    uniform: int | None = None


def embed(g: GraphBuilder, vit: nn.Module, images: str) -> Packed:
    """images [B, 3, S, S] float32 -> Packed with T = B * (num_patches + prefix) rows, x float32.

    The embedding runs in float32 in every export (an fp16 embedding flips near-tie token selections of the
    first pruning stage); see `patch_embed`."""
    C = int(vit.embed_dim)
    n0 = tokens_per_image(vit)
    f32 = np.float32
    x, bias_left = patch_embed(g, vit.patch_embed, images)  # [B, N, C]
    x = maybe_layer_norm(g, x, getattr(vit.patch_embed, "norm", None), "patch_embed.norm")

    batch = g.op("Shape", [images], hint="batch", start=0, end=1)  # [1] int64, the only Shape in the graph
    prefix = []
    for attr, p in prefix_tokens(vit):
        tok = g.weight(p, attr, dtype=f32)  # [1, n, C]
        shape = g.op("Concat", [batch, g.const([int(p.shape[1]), C], np.int64)], hint=f"{attr}.shape", axis=0)
        prefix.append(g.op("Expand", [tok, shape], hint=f"{attr}.expand"))
    pos_t = vit.pos_embed.detach().float().clone()  # [1, n, C]
    if bias_left:  # fold the patch projection's bias into the patch rows of the position embedding
        pos_t[:, pos_t.shape[1] - int(vit.patch_embed.num_patches) :] += vit.patch_embed.proj.bias.detach().float()
    pos = g.weight(pos_t, "pos_embed", dtype=f32)
    if getattr(vit, "no_embed_class", False):
        x = g.op("Add", [x, pos], hint="pos_add")
        x = g.op("Concat", [*prefix, x], hint="tokens", axis=1) if prefix else x
    else:
        x = g.op("Concat", [*prefix, x], hint="tokens", axis=1) if prefix else x
        x = g.op("Add", [x, pos], hint="pos_add")
    x = maybe_layer_norm(g, x, getattr(vit, "norm_pre", None), "norm_pre")  # [B, n0, C]
    x = float32_to_stream(g, x, "tokens.stream")  # fp16-all: the residual stream leaves the float32 embedding here
    x = g.op("Reshape", [x, g.const([-1, C], np.int64)], hint="packed")  # [B*n0, C]

    counts = g.op("Expand", [g.const([n0], np.int64), batch], hint="counts0")  # [B]
    cu = cu_from_counts(g, counts, "cu0")
    cu32 = g.op("Cast", [cu], hint="cu0_i32", to=TensorProto.INT32)
    return Packed(x=x, cu=cu, cu32=cu32, counts=counts, nmax=n0, uniform=n0)


def patch_embed(g: GraphBuilder, pe: nn.Module, images: str) -> tuple[str, bool]:
    """images [B, Cin, S, S] float32 -> patch embeddings [B, N, C] float32 (N = gh * gw, row-major grid).

    Non-overlapping patches (stride == kernel) are cut out with Reshape + Transpose and projected by one
    float32 MatMul [B, N, Cin*ph*pw] @ [Cin*ph*pw, C]: a cuBLAS GEMM (TF32 where the session enables it, as the
    Conv was), without cuDNN's NCHW->NHWC copies and its slow fp32 implicit-GEMM conv (0.37 of 2.6 ms GPU time
    at deit_base B=32 on the H200). Overlapping patches keep the Conv. Returns (x, bias_left): True when the
    projection bias was not added here and the caller must add it to the patch rows (embed folds it into the
    position embedding); a patch embedding with its own norm gets the bias here, before that norm."""
    proj = pe.proj
    f32 = np.float32
    C, cin = int(proj.out_channels), int(proj.in_channels)
    (ph, pw), (gh, gw) = tuple(proj.kernel_size), tuple(int(v) for v in pe.grid_size)
    if tuple(proj.stride) != (ph, pw):
        conv_in = [images, g.weight(proj.weight, "patch_embed.proj.weight", dtype=f32)]
        if proj.bias is not None:
            conv_in.append(g.weight(proj.bias, "patch_embed.proj.bias", dtype=f32))
        x = g.op("Conv", conv_in, hint="patch_embed.proj", kernel_shape=[ph, pw], strides=list(proj.stride))
        x = g.op("Reshape", [x, g.const([0, C, -1], np.int64)], hint="patch_embed.flat")  # [B, C, N]
        return g.op("Transpose", [x], hint="patch_embed.nlc", perm=[0, 2, 1]), False
    x = g.op("Reshape", [images, g.const([0, cin, gh, ph, gw, pw], np.int64)], hint="patch_embed.grid")
    x = g.op("Transpose", [x], hint="patch_embed.patches", perm=[0, 2, 4, 1, 3, 5])  # [B, gh, gw, Cin, ph, pw]
    x = g.op("Reshape", [x, g.const([0, gh * gw, cin * ph * pw], np.int64)], hint="patch_embed.rows")
    w = g.weight(proj.weight.reshape(C, cin * ph * pw), "patch_embed.proj.weight_t", transpose=True, dtype=f32)
    x = g.op("MatMul", [x, w], hint="patch_embed.proj.mm")  # [B, N, C]
    norm = getattr(pe, "norm", None)
    if proj.bias is None or norm is None or isinstance(norm, nn.Identity):
        return x, proj.bias is not None
    return g.op("Add", [x, g.weight(proj.bias, "patch_embed.proj.bias", dtype=f32)], hint="patch_embed"), False


def cu_from_counts(g: GraphBuilder, counts: str, hint: str) -> str:
    """counts [B] int64 -> cu [B+1] int64 = [0, cumsum(counts)] (on the device: CumSum + Concat)."""
    csum = g.op("CumSum", [counts, g.const(0, np.int64)], hint=f"{hint}.cumsum")
    return g.op("Concat", [g.const([0], np.int64), csum], hint=hint, axis=0)
