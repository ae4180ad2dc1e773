"""Classifier head on packed rows: final norm, token/avg pooling, fc_norm, head (+ DeiT distilled head)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto
from torch import nn

from raggedvit.exporter._builder import GraphBuilder
from raggedvit.exporter.embed import Packed
from raggedvit.exporter.layers import linear, maybe_layer_norm, stream_to_float32
from raggedvit.exporter.prune import row_coordinates

__all__ = ["head"]


def head(g: GraphBuilder, vit: nn.Module, state: Packed, *, num_prefix: int) -> str:
    """Packed x [T, C] float32 -> logits [B, classes] float32 (final norm and head in float32 in every export).

    'token': rows cu[:-1] (cls) and, for DeiT distilled, cu[:-1] + 1 (dist) -> (head + head_dist) / 2.
    'avg': per-image mean of the non-prefix rows (a [B, T] weight matrix times x).
    """
    f32 = np.float32
    first = g.op("Slice", [state.cu, g.const([0], np.int64), g.const([-1], np.int64)], hint="head.first_rows")  # [B]
    if getattr(vit, "global_pool", "token") == "avg":
        x = maybe_layer_norm(g, stream_to_float32(g, state.x, "head.x32"), vit.norm, "norm")
        q = 0 if getattr(vit, "pool_include_prefix", False) else num_prefix  # first pooled row of each image
        if state.uniform is not None:  # n rows per image: a static reshape, no NonZero
            n = int(state.uniform)
            x3 = g.op("Reshape", [x, g.const([-1, n, int(vit.embed_dim)], np.int64)], hint="head.images")
            if q:
                x3 = g.op("Slice", [x3, g.const([q], np.int64), g.const([n], np.int64), g.const([1], np.int64)])
            pooled = g.op("ReduceMean", [x3], hint="head.avg", axes=[1], keepdims=0)  # [B, C]
            pooled = maybe_layer_norm(g, pooled, getattr(vit, "fc_norm", None), "fc_norm")
            return linear(g, pooled, vit.head, "head", dtype=f32)
        seq, pos, zeros_b1 = row_coordinates(g, state, "head")
        b_col = g.op(
            "CumSum",
            [g.op("Add", [zeros_b1, g.const(1, np.int64)]), g.const(0, np.int64)],
            hint="head.b_col",
            exclusive=1,
        )  # [B, 1]
        member = g.op("Equal", [b_col, g.op("Unsqueeze", [seq, g.const([0], np.int64)])], hint="head.member")
        patch = g.op("Not", [g.op("Less", [pos, g.const(q, np.int64)])], hint="head.patch_row")  # [T]
        sel = g.op("Cast", [g.op("And", [member, patch])], hint="head.sel", to=TensorProto.FLOAT)  # [B, T]
        npatch = g.op(
            "Cast",
            [g.op("Sub", [g.op("Unsqueeze", [state.counts, g.const([1], np.int64)]), g.const(q, np.int64)])],
            hint="head.npatch",
            to=TensorProto.FLOAT,
        )
        pooled = g.op("Div", [g.op("MatMul", [sel, x]), npatch], hint="head.avg")  # [B, C]
        pooled = maybe_layer_norm(g, pooled, getattr(vit, "fc_norm", None), "fc_norm")
        return linear(g, pooled, vit.head, "head", dtype=f32)

    cls = stream_to_float32(g, g.op("Gather", [state.x, first], hint="head.cls", axis=0), "head.cls32")  # [B, C]
    cls = maybe_layer_norm(g, cls, vit.norm, "norm")
    cls = maybe_layer_norm(g, cls, getattr(vit, "fc_norm", None), "fc_norm")
    logits = linear(g, cls, vit.head, "head", dtype=f32)
    head_dist = getattr(vit, "head_dist", None)
    if head_dist is None:
        return logits
    dist_rows = g.op("Add", [first, g.const(1, np.int64)], hint="head.dist_rows")
    dist = stream_to_float32(g, g.op("Gather", [state.x, dist_rows], hint="head.dist", axis=0), "head.dist32")
    dist = maybe_layer_norm(g, dist, vit.norm, "norm_dist")
    dist = maybe_layer_norm(g, dist, getattr(vit, "fc_norm", None), "fc_norm_dist")
    dist_logits = linear(g, dist, head_dist, "head_dist", dtype=f32)
    both = g.op("Add", [logits, dist_logits], hint="head.sum")
    return g.op("Mul", [both, g.const(np.asarray(0.5, dtype=f32))], hint="head.mean")
