"""Per-block drift: the residual stream after every block, export vs reference, on each image's kept rows.

The exporter names each block's output tensor and each stage's src and cu_seqlens in the graph (recipe keys
"block_outputs", "stage_outputs"); `marked_model` returns a copy of the model with those tensors as extra graph
outputs (the user's file is not touched, as Polygraphy's `--onnx-outputs mark all`). The reference's block outputs
come from PrunedViT(..., block_outputs=True).

Rows are matched by original token index: every stage keeps each image's rows in position order (the evit fused
token last), so two runs that kept the same tokens of an image hold them in the same order. The export's kept
tokens come from its stages' src (pruning.kept_token_index), or from diagnostic outputs (token_index_S) of an
older export without "stage_outputs"; with neither, equal token counts stand for equal sets (a same-count swap
then shows as drift of the blocks after it). An image whose kept tokens differ from the reference's at a stage has
no drift from that stage's first block on.

The measure: drift[b] = ||h_export - h_reference||_F / ||h_reference||_F over image b's kept rows, in float64.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn

from raggedvit.pruning import PrunedOutput, PruneSpec, build_pruned_vit
from raggedvit.pruning.packed import kept_token_index
from raggedvit.validators.errors import ValidationInputError

__all__ = [
    "BlockReference",
    "BlockRun",
    "block_reference",
    "block_drift",
    "block_floor_run",
    "floor_dtype_name",
    "marked_model",
    "run_blocks_onnx",
    "run_blocks_reference",
]


@dataclass
class BlockRun:
    """Per-block output rows of one run over N images: rows[i][bi] [n_rows, C] float64 (image i's rows after
    block bi, position order) or None where unavailable; kept[i][s]: sorted kept token indices of stage s, or None
    (unknown: equal counts stand for equal sets); counts [N, stages] int64."""

    rows: list[list[np.ndarray | None]]
    counts: np.ndarray
    kept: list[list[np.ndarray] | None]


def _split(x: np.ndarray, rows_per_image: list[int]) -> list[np.ndarray]:
    """x [T, C] (rows past the sum: dead rows) -> per image its rows, float64."""
    out, start = [], 0
    for n in rows_per_image:
        out.append(x[start : start + n].astype(np.float64))
        start += n
    return out


def _stage_of(block: int, spec: PruneSpec) -> int:
    """The number of stages that ran before block `block` (its rows are the last of those stages' kept rows)."""
    return sum(1 for at in spec.prune_at if at <= block)


def marked_model(model: str | Path | onnx.ModelProto, names: list[str]) -> bytes:
    """The model (a path: the file is not changed; a ModelProto: changed in place) with the tensors `names`
    appended as graph outputs (no type: ORT infers it), serialized."""
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model))
    produced = {o for n in model.graph.node for o in n.output}
    produced |= {i.name for i in model.graph.initializer} | {i.name for i in model.graph.input}
    missing = [n for n in names if n not in produced]
    if missing:
        raise ValidationInputError(f"tensors {missing[:3]} named by the export's recipe are not in the graph")
    have = {o.name for o in model.graph.output}
    for name in names:
        if name not in have:
            model.graph.output.append(onnx.ValueInfoProto(name=name))
    return model.SerializeToString()


def _rows_per_image(bi: int, counts: np.ndarray, spec: PruneSpec, total: int, head_k: int | None) -> list[int]:
    """Rows of each image in block `bi`'s output of `total` rows (counts [B, stages] of that run): the tokens kept by
    the last stage before the block (all rows split evenly before any stage), or `head_k` per image for the last
    block when the head reads a fixed number of rows per image. Rows past the sum are dead (capacity layout)."""
    B = counts.shape[0]
    st = _stage_of(bi, spec)
    if head_k is not None:
        return [head_k] * B
    if st == 0:
        return [total // B] * B
    return [int(v) for v in counts[:, st - 1]]


def run_blocks_onnx(
    session,
    images: torch.Tensor,
    names: list[str],
    spec: PruneSpec,
    head_k: int | None,
    batch_size: int,
    stage_outputs: list[list[str]] | None = None,
    tokens: int | None = None,
) -> BlockRun:
    """The marked session's block outputs `names` over `images` [N, 3, S, S] -> BlockRun (rows [] per image
    without `names`). head_k: the reference's rows per image of the last block when the head reads a fixed number
    (run_blocks_reference). stage_outputs: per stage the [src, cu_seqlens] tensor names of the recipe (marked too),
    with `tokens` the tokens per image before the first stage (recipe "tokens_per_image"): the kept tokens come
    from them; else from diagnostic graph outputs token_index_S / cu_seqlens_S where present, else unknown."""
    outputs = [o.name for o in session.get_outputs()]
    diag = sum(name.startswith("token_index_") for name in outputs)
    rows: list[list[np.ndarray | None]] = []
    counts, kept = [], []
    for s in range(0, images.shape[0], batch_size):
        res = session.run(outputs, {"images": images[s : s + batch_size].numpy()})
        by_name = dict(zip(outputs, res))
        tc = np.asarray(res[1], dtype=np.int64)
        counts.append(tc)
        B = tc.shape[0]
        if stage_outputs and tokens is not None:
            srcs = [torch.from_numpy(np.asarray(by_name[src], dtype=np.int64)) for src, _ in stage_outputs]
            index = kept_token_index(srcs, B, int(tokens), spec.fuse)
            per_stage = [_split_index(ix.numpy(), by_name[cu]) for ix, (_, cu) in zip(index, stage_outputs)]
            kept.extend([list(v) for v in zip(*per_stage)])
        elif diag:
            per_stage = [_split_index(by_name[f"token_index_{k}"], by_name[f"cu_seqlens_{k}"]) for k in range(diag)]
            kept.extend([list(v) for v in zip(*per_stage)])
        else:
            kept.extend([None] * B)
        per_block = []
        for bi, name in enumerate(names):
            x = np.asarray(by_name[name])
            k = head_k if bi == len(names) - 1 else None
            per_block.append(_split(x, _rows_per_image(bi, tc, spec, x.shape[0], k)))
        rows.extend([list(v) for v in zip(*per_block)] if per_block else [[] for _ in range(B)])
    return BlockRun(rows, np.concatenate(counts), kept)


def _split_index(index, cu) -> list[np.ndarray]:
    return [np.sort(np.asarray(index[int(cu[b]) : int(cu[b + 1])])) for b in range(len(cu) - 1)]


def _attention64(qkv, cu_seqlens, num_heads, *, scale=None, max_seqlen=None, return_cls_attn=False, **kw):
    """raggedvit.kernels.ragged_attention's semantics in float64 (its CPU path computes in the input dtype)."""
    from raggedvit.kernels._cpu import ragged_attention_cpu

    D = qkv.shape[1] // (3 * num_heads)
    out, cls = ragged_attention_cpu(
        qkv.contiguous(), cu_seqlens, num_heads, D**-0.5 if scale is None else float(scale), return_cls_attn, **kw
    )
    return (out, cls) if return_cls_attn else out


def run_blocks_reference(
    vit: nn.Module,
    spec: PruneSpec,
    images: torch.Tensor,
    batch_size: int,
    *,
    dtype: torch.dtype = torch.float32,
    outputs: list[PrunedOutput] | None = None,
) -> tuple[BlockRun, np.ndarray, int | None]:
    """PrunedViT(vit, spec, block_outputs=True) with the model and images in `dtype` (float32: the reference;
    float16 / float64: a floor run) -> (BlockRun, logits [N, classes] float64, head_k: rows per image of the last
    block when the head reads a fixed number per image (the class token), else None). `outputs`: a list that
    receives each batch's PrunedOutput (without its block rows)."""
    model_vit = vit if dtype == torch.float32 else copy.deepcopy(vit).to(dtype)
    attention = _attention64 if dtype == torch.float64 else None
    model = build_pruned_vit(model_vit.eval(), spec, attention=attention, block_outputs=True)
    rows, counts, kept, logits = [], [], [], []
    head_k = None
    with torch.no_grad():
        for s in range(0, images.shape[0], batch_size):
            out = model(images[s : s + batch_size].to(dtype))
            if outputs is not None:
                outputs.append(out._replace(blocks=()))
            tc = out.token_counts.numpy()
            counts.append(tc)
            logits.append(out.logits.double().numpy())
            per_stage = [_split_index(i.numpy(), c.numpy()) for i, c in zip(out.token_index, out.cu_seqlens)]
            B = tc.shape[0]
            kept.extend([list(v) for v in zip(*per_stage)] if per_stage else [[] for _ in range(B)])
            depth = len(out.blocks)
            last = out.blocks[-1].shape[0] if depth else 0
            st = _stage_of(depth - 1, spec)
            # the head's fixed rows: the last block's rows are not the stage's counts (before any stage: fewer
            # rows than block 0's, or the model has one block; an even split is right either way)
            if depth and ((st and last != int(tc[:, st - 1].sum())) or (not st and last != out.blocks[0].shape[0])):
                head_k = last // B
            per_block = []
            for bi, x in enumerate(out.blocks):
                k = head_k if bi == depth - 1 else None
                per_block.append(_split(x.double().numpy(), _rows_per_image(bi, tc, spec, x.shape[0], k)))
            rows.extend([list(v) for v in zip(*per_block)])
    return BlockRun(rows, np.concatenate(counts), kept), np.concatenate(logits), head_k


def _same_tokens(a: BlockRun, b: BlockRun, i: int, stage: int) -> bool:
    """Image i kept the same tokens in runs a and b at every stage < `stage`."""
    for s in range(stage):
        if int(a.counts[i, s]) != int(b.counts[i, s]):
            return False
        ka, kb = a.kept[i], b.kept[i]
        if ka is not None and kb is not None and not np.array_equal(ka[s], kb[s]):
            return False
    return True


def block_drift(run: BlockRun, ref: BlockRun, spec: PruneSpec) -> list[list[float | None]]:
    """[N][depth] ||h_run - h_ref|| / ||h_ref|| over each image's rows after each block; None where the image's kept
    tokens differ between the runs at a stage before the block (or its rows are not comparable)."""
    out = []
    for i, (rows, ref_rows) in enumerate(zip(run.rows, ref.rows)):
        per = []
        for bi, (h, r) in enumerate(zip(rows, ref_rows)):
            if h is None or r is None or h.shape != r.shape or not _same_tokens(run, ref, i, _stage_of(bi, spec)):
                per.append(None)
                continue
            norm = float(np.linalg.norm(r))
            d = float(np.linalg.norm(h - r))
            per.append(d / norm if norm > 0 else (0.0 if d == 0 else float("inf")))
        out.append(per)
    return out


def floor_dtype_name(dtype: str) -> tuple[torch.dtype, torch.dtype]:
    """(floor run dtype, the dtype it is compared against) of an export dtype: fp16 / fp16-all exports: PyTorch's
    float16 forward against the float32 reference; fp32: the float32 reference against a float64 run."""
    if dtype in ("fp16", "fp16-all"):
        return torch.float16, torch.float32
    return torch.float32, torch.float64


def block_floor_run(vit, spec, images, batch_size, ref: BlockRun, ref_logits: np.ndarray, dtype: str):
    """The per-block floor of export `dtype` [N][depth] and the logit floor [N] (max |Δlogit|) on `images`:
    fp16: PyTorch float16 vs the float32 reference `ref`; fp32: `ref` (float32) vs a float64 run."""
    low, high = floor_dtype_name(dtype)
    if high == torch.float32:
        run, logits, _ = run_blocks_reference(vit, spec, images, batch_size, dtype=low)
        drift = block_drift(run, ref, spec)
        dl = np.abs(logits - ref_logits)
    else:
        exact, logits64, _ = run_blocks_reference(vit, spec, images, batch_size, dtype=high)
        drift = block_drift(ref, exact, spec)
        dl = np.abs(ref_logits - logits64)
    return drift, [float(np.nanmax(row)) if row.size else 0.0 for row in dl]


@dataclass
class BlockReference:
    """The reference side of the per-block rule on one set of images: the fp32 reference's BlockRun, its logits
    [N, classes] float64, head_k (run_blocks_reference), and the floor of the export dtype: floors [N][depth],
    logit_floor [N] (block_floor_run); decisions: the reference forward over all N images in one batch (its stage
    decisions, which validate reads for the cut margins and kept tokens), or None when it ran in several."""

    run: BlockRun
    logits: np.ndarray
    head_k: int | None
    floors: list[list[float | None]]
    logit_floor: list[float]
    decisions: PrunedOutput | None = None


def block_reference(
    vit: nn.Module, spec: PruneSpec, images: torch.Tensor, dtype: str, batch_size: int = 16
) -> BlockReference:
    """The reference and floor runs of the per-block rule for exports of `dtype` on `images` [N, 3, S, S]: the
    same for every export of (vit, spec) in that dtype (fp16 and fp16-all share one: the fp16 floor), so a caller
    validating several may compute it once. batch_size >= N keeps the forward's stage decisions (`decisions`),
    which spares validate a forward of its own."""
    outs: list[PrunedOutput] = []
    run, logits, head_k = run_blocks_reference(vit, spec, images, batch_size, outputs=outs)
    floors, logit_floor = block_floor_run(vit, spec, images, batch_size, run, logits, dtype)
    return BlockReference(run, logits, head_k, floors, logit_floor, outs[0] if len(outs) == 1 else None)
