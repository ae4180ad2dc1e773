"""Pruned timm ViT -> ONNX, built explicitly node by node from the module's weights (no tracing)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnx import TensorProto
from torch import nn

import raggedvit
from raggedvit.exporter._builder import GraphBuilder
from raggedvit.exporter._io import atomic_write
from raggedvit.exporter.blocks import RAGGED_DOMAIN, block
from raggedvit.exporter.embed import embed
from raggedvit.exporter.head import head
from raggedvit.exporter.metadata import write_recipe
from raggedvit.exporter.prune import l2_scores, prune_stage
from raggedvit.exporter.support import check_supported, tokens_per_image

__all__ = ["DTYPES", "OPSET", "build_model", "export_onnx", "stage_blocks"]

OPSET = 17
# export dtype -> (GEMM / attention dtype, residual-stream dtype); layers.py documents the recipes
_DTYPES = {"fp32": (np.float32, np.float32), "fp16": (np.float16, np.float32), "fp16-all": (np.float16, np.float16)}
DTYPES = tuple(_DTYPES)
_CLS_ATTN_POLICIES = ("evit", "cls-mass")


def stage_blocks(spec: Any, depth: int) -> tuple[int, ...]:
    """The sorted prune_at indices of `spec` ( () for policy none ); each must lie in 1..depth-1."""
    if spec.policy == "none":
        return ()
    at = tuple(sorted(int(i) for i in spec.prune_at))
    if not at:
        raise ValueError(f"policy {spec.policy!r} needs at least one prune_at block index")
    if len(set(at)) != len(at) or at[0] < 1 or at[-1] > depth - 1:
        raise ValueError(f"prune_at {list(spec.prune_at)} must be distinct block indices in 1..{depth - 1}")
    return at


def build_model(
    vit: nn.Module, spec: Any, *, dtype: str = "fp32", recipe: dict[str, Any] | None = None
) -> onnx.ModelProto:
    """The ONNX graph of `vit` pruned by `spec`.

    Inputs: images [batch, 3, S, S] float32 (already normalised). Outputs: logits [batch, classes]
    float32 and token_counts [batch, stages] int64 (tokens per image after each stage; [batch, 0]
    for policy none). `dtype` "fp16" runs the block GEMMs, attention and GELU in float16; the residual
    stream, LayerNorms, pruning scores and head stay float32. "fp16-all" also keeps the residual stream and its
    LayerNorms in float16 (no Casts in the blocks; embedding, scores and head stay float32). layers.py has both.
    """
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    check_supported(vit)
    depth = len(vit.blocks)
    stages = stage_blocks(spec, depth)
    p = int(vit.num_prefix_tokens)
    g = GraphBuilder(*_DTYPES[dtype])
    images = g.add_input("images", TensorProto.FLOAT, ["batch", 3, *vit.patch_embed.img_size])
    logits_name, counts_name = g.name("logits"), g.name("token_counts")

    with torch.no_grad():
        state = embed(g, vit, images)
        counts0 = state.counts
        stage_counts: list[str] = []
        cls_attn: str | None = None
        normed: str | None = None  # norm1 of the next block, from the previous block's fused tail
        for i, blk in enumerate(vit.blocks):
            if i in stages:
                k = stages.index(i)
                scores = (
                    l2_scores(g, state.x, int(vit.embed_dim), f"stage{k}.l2") if spec.policy == "topk-l2" else cls_attn
                )
                state = prune_stage(
                    g,
                    state,
                    scores,
                    policy=spec.policy,
                    keep=float(spec.keep),
                    mass=float(spec.mass),
                    fuse=bool(spec.fuse) and spec.policy == "evit",
                    num_prefix=p,
                    hint=f"stage{k}",
                )
                stage_counts.append(state.counts)
            # fuse this block's tail with the next block's norm1 unless a prune stage (which gathers rows) or the
            # head (which normalises the class rows only) comes next
            nxt = vit.blocks[i + 1] if i + 1 < depth and (i + 1) not in stages else None
            x, cls_attn, normed = block(
                g,
                blk,
                state,
                i,
                want_cls_attn=(i + 1) in stages and spec.policy in _CLS_ATTN_POLICIES,
                normed=normed,
                next_block=nxt,
            )
            state = dataclasses.replace(state, x=x)
        logits = head(g, vit, state, num_prefix=p)

    g.op("Identity", [logits], outputs=[logits_name])  # the head is float32 in every export
    cols = [g.op("Unsqueeze", [c, g.const([1], np.int64)], hint="token_counts.col") for c in stage_counts]
    if cols:
        g.op("Concat", cols, outputs=[counts_name], axis=1)
    else:
        col0 = g.op("Unsqueeze", [counts0, g.const([1], np.int64)], hint="token_counts.col")
        g.op(
            "Slice",
            [col0, g.const([0], np.int64), g.const([0], np.int64), g.const([1], np.int64)],
            outputs=[counts_name],
        )
    g.add_output(logits_name, TensorProto.FLOAT, ["batch", int(vit.head.out_features)])
    g.add_output(counts_name, TensorProto.INT64, ["batch", len(stages)])

    model = g.build("raggedvit", {"": OPSET, RAGGED_DOMAIN: 1, "com.microsoft": 1})
    full = {
        **(recipe or {}),
        "prune": spec.to_dict(),
        "dtype": dtype,
        "img_size": int(vit.patch_embed.img_size[0]),
        "num_prefix_tokens": p,
        "tokens_per_image": tokens_per_image(vit),
        "depth": depth,
        "raggedvit_version": raggedvit.__version__,
    }
    write_recipe(model, full)
    return model


def export_onnx(
    vit: nn.Module, spec: Any, path: str | Path, *, dtype: str = "fp32", recipe: dict[str, Any] | None = None
) -> Path:
    """Build, check (onnx.checker full_check) and write the model atomically to `path`; returns the path."""
    model = build_model(vit, spec, dtype=dtype, recipe=recipe)
    onnx.checker.check_model(model, full_check=True)
    atomic_write(path, model.SerializeToString())
    return Path(path)
