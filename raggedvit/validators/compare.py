"""ORT vs PyTorch on the same images: |Δlogit|, top-1 and token_counts agreement, near-ties and precision ties,
pass/fail under the export dtype's rule (rules.py)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn
from tqdm import tqdm

from raggedvit.pruning import PrunedOutput, PruneSpec, backbone_for, build_pruned_vit
from raggedvit.validators.blocks import BlockReference, block_drift, block_reference, marked_model, run_blocks_onnx
from raggedvit.validators.errors import ValidationInputError
from raggedvit.validators.floor import FLOOR_DTYPES, precision_floor
from raggedvit.validators.reference import run_reference
from raggedvit.validators.report import Failure, ImageRow, NearTie, TokenSwap, ValidationReport, blocks_before
from raggedvit.validators.rules import Thresholds
from raggedvit.validators.session import open_session
from raggedvit.validators.structure import check_structure
from raggedvit.validators.ties import (
    first_moved_stage,
    precision_swap,
    precision_tie,
    size_swaps,
    stage_margins,
    token_swaps,
)

__all__ = ["block_failure_text", "first_failing_block", "run_onnx", "validate"]


def run_onnx(
    session,
    images: torch.Tensor,
    batch_size: int = 16,
    progress: bool = False,
    kept: list | None = None,
    sizes: list | None = None,
):
    """images [N, 3, S, S] -> (logits [N, classes] float32, token_counts [N, stages] int64) numpy, in batches.

    The first output is the logits (`features` for headless models). `kept`: a list that receives, per image, the
    sorted kept token indices of each stage, when the export has diagnostic outputs (token_index_S, cu_seqlens_S).
    `sizes`: a list that receives, per image, each stage's row sizes in the order of `kept` (tome exports with
    diagnostic outputs: token_size_S)."""
    outputs = [o.name for o in session.get_outputs()]
    stages = sum(name.startswith("token_index_") for name in outputs)
    has_sizes = stages and "token_size_0" in outputs
    logits, counts = [], []
    chunks = range(0, images.shape[0], batch_size)
    for s in tqdm(chunks, desc="onnxruntime", disable=None if progress else True, leave=False):
        res = session.run(outputs, {"images": images[s : s + batch_size].numpy()})
        logits.append(res[0])
        counts.append(res[1])
        by_name = dict(zip(outputs, res))
        if kept is not None and stages:
            by_stage = [_split_kept(res[2 + 2 * k], res[3 + 2 * k]) for k in range(stages)]
            kept.extend([list(per_image) for per_image in zip(*by_stage)])
        if sizes is not None and has_sizes:
            by_stage = [_split_sizes(res[2 + 2 * k], res[3 + 2 * k], by_name[f"token_size_{k}"]) for k in range(stages)]
            sizes.extend([list(per_image) for per_image in zip(*by_stage)])
    return np.concatenate(logits), np.concatenate(counts)


def _split_kept(token_index, cu) -> list:
    """token_index [T] and cu [B+1] of one stage -> per image the sorted kept token indices. Rows past cu[B] (the
    dead rows of a capacity-layout export, DESIGN.md section 4) are not read."""
    return [np.sort(np.asarray(token_index[int(cu[b]) : int(cu[b + 1])])) for b in range(len(cu) - 1)]


def _split_sizes(token_index, cu, size) -> list:
    """A tome stage's token_index [T], cu [B+1] and token_size [T] -> per image the sizes of its rows in the order of
    `_split_kept` (ascending token index: a merged row is matched by its destination token)."""
    out = []
    for b in range(len(cu) - 1):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        out.append(np.asarray(size[rows])[np.argsort(np.asarray(token_index[rows]), kind="stable")])
    return out


def validate(
    model_path: str | Path,
    images: torch.Tensor,
    names: list[str],
    *,
    vit: nn.Module,
    spec: PruneSpec,
    recipe: dict,
    device: str = "cpu",
    thresholds: Thresholds | None = None,
    batch_size: int = 16,
    progress: bool = False,
    session: ort.InferenceSession | None = None,
    floor: bool | None = None,
    blocks: bool = True,
    reference_blocks: BlockReference | None = None,
    structure: bool = True,
) -> ValidationReport:
    """Compare the ONNX model in ORT with the PyTorch reference on `images` [N, 3, S, S] float32 (CPU).

    `thresholds`: None = the default rule of the recipe's export dtype (Thresholds.for_dtype). Images with a
    near-tie at a pruning cut, and images where the export moved a cut within its precision's margin (precision
    ties), are listed and excluded from the failure criteria; any other moved cut fails, naming image and stage.
    `session`: an ORT session of `model_path` on `device` already opened by the caller (else one is opened).
    `floor`: also measure the logit precision floor of the export dtype (validators/floor.py); None = for
    reduced-precision exports (fp16, fp16-all) only. It does not change pass/fail.
    Per-block drift (validators/blocks.py) is measured when the recipe names the block output tensors: the
    export's residual stream after each block against the reference's, and the same for PyTorch at the export's
    precision (fp32 exports: fp32 against float64), which sets each block's floor. `blocks`: False skips it.
    `reference_blocks`: those reference and floor runs when the caller has them (`block_reference` of the same
    vit, spec, images and export dtype; validating several exports of one model), else they are run here.
    `structure`: also compare the graph's numeric attributes with `vit`'s modules (validators/structure.py: norm
    epsilons, GELU flavour, attention heads and scale, LayerScale, patch size and stride); a mismatch fails.
    """
    dtype = str(recipe.get("dtype", "fp32"))
    th = thresholds or Thresholds.for_dtype(dtype)
    spec = spec.resolve(backbone_for(vit).depth)  # tome's every-block default as the export resolved it
    if session is None:
        session = open_session(model_path, device, recipe=recipe)
    images = images.to("cpu", torch.float32).contiguous()
    kept_o: list = []
    sizes_o: list = []
    lg_o, tc_o = run_onnx(session, images, batch_size, progress, kept=kept_o, sizes=sizes_o)
    names_b = list(recipe.get("block_outputs") or []) if blocks else []
    names_s = _stage_outputs(recipe, spec)
    graph = onnx.load(str(model_path)) if structure or names_b or names_s else None
    pruned = build_pruned_vit(vit, spec)
    stage_modules = {b: pruned.scorers[s] for s, b in enumerate(spec.prune_at)}  # a learned scorer's norms and GELUs
    struct = check_structure(graph, vit, recipe.get("block_outputs"), stage_modules) if structure else None
    if names_b:  # the reference with its block outputs (the same forward; its logits are run_reference's)
        rb = reference_blocks or block_reference(vit, spec, images, dtype, batch_size)
        if len(rb.run.rows) != images.shape[0]:
            raise ValueError(f"reference_blocks has {len(rb.run.rows)} images, validating {images.shape[0]}")
        lg_r, tc_r = rb.logits.astype(np.float32), rb.run.counts
    else:
        lg_r, tc_r = run_reference(vit, spec, images, batch_size, progress)
    # one PrunedViT forward over all images for the stage decisions: every cut's margin (eps inf) and kept tokens
    # (the block reference's own when it ran in one batch)
    ref_out = rb.decisions if names_b and spec.prune_at else None
    if ref_out is None and spec.prune_at:
        with torch.no_grad():
            ref_out = pruned(images)
    margins = stage_margins(ref_out, spec, pruned.num_prefix, math.inf) if ref_out is not None else []
    sizes_r = _reference_sizes(ref_out) if sizes_o and ref_out is not None else []
    ties = [t for t in margins if t.gap < th.tie_eps]
    tied = {t.image for t in ties}
    fl = precision_floor(vit, spec, images, lg_r, tc_r, dtype, batch_size=batch_size) if floor is not False else None
    if floor and fl is None:
        raise ValidationInputError(f"export dtype {dtype!r} has no precision floor (only {', '.join(FLOOR_DTYPES)})")
    drift: list[list[float | None]] = [[] for _ in names]
    block_floor: list[float | None] = []
    block_note = "" if blocks else "per-block drift not measured (turned off)"
    if names_b or names_s:  # one marked copy: the block outputs and the stages' src and cu_seqlens
        marked = open_session(marked_model(graph, names_b + sum(names_s, [])), device, recipe=recipe)
        tokens = int(recipe.get("tokens_per_image") or 0) or None
        head_k = rb.head_k if names_b else None
        run_b = run_blocks_onnx(marked, images, names_b, spec, head_k, batch_size, names_s, tokens)
        if names_s and all(k is not None for k in run_b.kept):
            kept_o = run_b.kept
    kept_r = _reference_kept(ref_out) if kept_o and ref_out is not None else []
    if names_b:
        floors, logit_floor = rb.floors, rb.logit_floor
        drift = block_drift(run_b, rb.run, spec)
        clean = [i for i in range(len(names)) if i not in tied]
        block_floor = [
            max((floors[i][bi] for i in clean if floors[i][bi] is not None), default=None) for bi in range(len(names_b))
        ]
        th = th.with_logit_floor(max((logit_floor[i] for i in clean), default=0.0))
    elif blocks:
        block_note = "per-block drift not measured: the export's recipe names no block output tensors"
    report = ValidationReport(
        model=str(model_path),
        recipe=recipe,
        device=device,
        providers=list(session.get_providers()),
        thresholds=th,
        near_ties=ties,
        block_floor=block_floor,
        block_note=block_note,
        structure=struct,
    )
    if struct is not None:
        report.failures.extend(Failure("structure", None, f"structure: {c.text()}") for c in struct.mismatches)
    notes: dict[int, str] = {}
    swap_notes: dict[int, str] = {}
    for i, name in enumerate(names):
        moved = first_moved_stage([int(v) for v in tc_o[i]], [int(v) for v in tc_r[i]])
        swaps = token_swaps(kept_o[i], kept_r[i], ref_out, spec, i) if kept_o and kept_r else []
        if sizes_o and sizes_r:  # tome: the same merged rows (destination tokens) holding other sizes
            swaps = sorted(swaps + size_swaps(kept_o[i], kept_r[i], sizes_o[i], sizes_r[i], spec, i), key=_stage)
        swaps = [t for t in swaps if moved is None or t.stage < moved]  # past a moved count the rows differ
        prec = None
        if swaps and i not in tied:  # the first deviation: equal counts, other tokens kept
            prec = precision_swap(swaps[0], th.precision_eps)
            if prec is not None:
                report.precision_ties.append(prec)
            else:
                swap_notes[i] = _swap_note(swaps[0], th)
        elif moved is not None and i not in tied:
            mine = [t for t in margins if t.image == i]
            by = int(tc_o[i, moved]) - int(tc_r[i, moved])
            prec = precision_tie(mine, moved, by, spec, th.precision_eps)
            if prec is not None:
                report.precision_ties.append(prec)
            else:
                notes[i] = _moved_cut_note(mine, moved, by, spec, th)
        d = np.abs(lg_o[i].astype(np.float64) - lg_r[i].astype(np.float64))
        report.rows.append(
            ImageRow(
                index=i,
                name=name,
                max_abs_diff=float(np.nanmax(d)) if d.size else 0.0,
                mean_abs_diff=float(np.nanmean(d)) if d.size else 0.0,
                top1_onnx=int(np.argmax(lg_o[i])),
                top1_reference=int(np.argmax(lg_r[i])),
                counts_onnx=[int(v) for v in tc_o[i]],
                counts_reference=[int(v) for v in tc_r[i]],
                near_tie=i in tied,
                ref_max_abs_logit=float(np.nanmax(np.abs(lg_r[i]))) if lg_r[i].size else 0.0,
                floor_weights=None if fl is None else fl.weights[i],
                floor_torch=None if fl is None else fl.torch[i],
                floor_weights_same_counts=None if fl is None else fl.weights_same_counts[i],
                floor_torch_same_counts=None if fl is None else fl.torch_same_counts[i],
                precision_tie=prec is not None,
                token_swaps=swaps,
                block_drift=drift[i],
            )
        )
    report.failures.extend(
        _failures(report.rows, lg_o, th, notes, block_floor, tuple(spec.prune_at), kept=bool(kept_o), swaps=swap_notes)
    )
    return report


def _stage_outputs(recipe: dict, spec: PruneSpec) -> list[list[str]]:
    """The recipe's per-stage [src, cu_seqlens] tensor names ([] for exports older than the key)."""
    pairs = [[str(n) for n in pair] for pair in recipe.get("stage_outputs") or []]
    if pairs and (len(pairs) != len(spec.prune_at) or any(len(p) != 2 for p in pairs)):
        raise ValidationInputError(
            f"the recipe's stage_outputs name {len(pairs)} stages, its prune spec has {len(spec.prune_at)}"
        )
    return pairs


def _stage(swap: TokenSwap) -> int:
    return swap.stage


def _swap_note(swap: TokenSwap, th: Thresholds) -> str:
    """Why the first stage where the export kept other tokens than the reference (equal counts) is not a tie."""
    if swap.resized:
        return (
            f"stage {swap.stage} (block {swap.block}) merged other tokens than the reference: {swap.resized} of the "
            "same merged rows hold other sizes"
        )
    where = f"stage {swap.stage} (block {swap.block}) kept {swap.swapped} other token{'' if swap.swapped == 1 else 's'}"
    if th.precision_eps is None:
        why = f"the reference's score gap between them is {swap.gap:.2e} >= the near-tie margin {th.tie_eps:g}"
    elif swap.swapped != 1:
        why = "rounding swaps one token at a cut"
    else:
        why = f"the reference's score gap between them is {swap.gap:.2e} >= the precision margin {th.precision_eps:.3g}"
    return f"{where} than the reference at equal counts: {why}"


def _reference_kept(out: PrunedOutput) -> list:
    """Per image, the sorted kept token indices of each stage of a PrunedViT forward."""
    stages = [_split_kept(index.numpy(), cu.numpy()) for index, cu in zip(out.token_index, out.cu_seqlens)]
    return [list(per_image) for per_image in zip(*stages)]


def _reference_sizes(out: PrunedOutput) -> list:
    """Per image, each tome stage's row sizes of a PrunedViT forward, in the order of `_reference_kept`."""
    stages = [
        _split_sizes(index.numpy(), cu.numpy(), size.numpy())
        for index, cu, size in zip(out.token_index, out.cu_seqlens, out.token_size)
    ]
    return [list(per_image) for per_image in zip(*stages)]


def _moved_cut_note(margins: list[NearTie], stage: int, moved_by: int, spec: PruneSpec, th: Thresholds) -> str:
    """Why a cut the export moved by `moved_by` tokens at `stage` is not a tie (see ties.precision_tie)."""
    block = spec.prune_at[stage] if stage < len(spec.prune_at) else "?"
    where = f"stage {stage} (block {block}) by {moved_by:+d} token{'' if abs(moved_by) == 1 else 's'}"
    if spec.merges:
        return f"{where}: tome merges min(r, P // 2) tokens whatever the similarities, so no rounding moves a count"
    if spec.descriptor.cut != "mass":
        return f"{where}: {spec.policy} keeps ceil(P x keep) tokens whatever the scores, so no rounding moves a count"
    mass = [t.gap for t in margins if t.stage == stage and t.kind == "mass"]
    gap = f"{min(mass):.2e}" if mass else "inf"
    if th.precision_eps is not None and abs(moved_by) > 1:
        return f"{where}: rounding moves a cls-mass cut by one token (the reference's margin there is {gap})"
    eps = th.precision_eps if th.precision_eps is not None else th.tie_eps
    what = "precision" if th.precision_eps is not None else "near-tie"
    return f"{where}: the reference's mass margin there is {gap} >= the {what} margin {eps:.3g}"


def first_failing_block(
    drift: list[float | None], floor: list[float | None], th: Thresholds
) -> tuple[int | None, float]:
    """(the first block whose drift exceeds th.block_bar(its floor), or None; the largest drift / floor ratio of
    the blocks before it (of every block when none fails))."""
    within = 0.0
    for bi, (d, f) in enumerate(zip(drift, floor)):
        if d is None or f is None:
            continue
        if d > th.block_bar(f):
            return bi, within
        within = max(within, d / f if f > 0 else (0.0 if d == 0 else math.inf))
    return None, within


def block_failure_text(
    row: ImageRow, floor: list[float | None], th: Thresholds, spec_blocks: dict[int, int], kept: bool = True
) -> str:
    """'block 7 drifts 9x its fp16 floor (drift 1.2e-02 > bar 3.4e-03); blocks 0-6 within 1.2x' for the image's
    first failing block; where the export's kept tokens are unknown (`kept` False: an export older than the recipe's
    "stage_outputs", without diagnostic outputs) a failing first block after a stage of a reduced-precision export
    says how to tell a token swapped by rounding at that cut from a fault."""
    bi, within = first_failing_block(row.block_drift, floor, th)
    assert bi is not None
    d, f = row.block_drift[bi], floor[bi]
    ratio = d / f if f else math.inf
    where = f" (the first block after stage {spec_blocks[bi]})" if bi in spec_blocks else ""
    before = blocks_before(bi, within)
    hint = ""
    if bi in spec_blocks and not kept and th.precision_eps is not None:
        hint = "; re-export with this raggedvit (its exports name each stage's kept tokens) to tell one token swapped "
        hint += "at that cut by rounding (a precision tie) from a fault"
    return (
        f"block {bi}{where} drifts {ratio:.3g}x its {th.floor_name()} floor "
        f"(drift {d:.2e} > bar {th.block_bar(f):.2e}); {before}{hint}"
    )


def _failures(
    rows: list[ImageRow],
    logits_onnx: np.ndarray,
    th: Thresholds,
    moved_notes: dict[int, str] | None = None,
    block_floor: list[float | None] | None = None,
    prune_at: tuple[int, ...] = (),
    kept: bool = True,
    swaps: dict[int, str] | None = None,
) -> list[Failure]:
    """The failed criteria over `rows`; `moved_notes`: per image, why its moved cut is not a tie (for the text);
    `swaps`: per image, why the first stage where it kept other tokens at equal counts is not a tie; `block_floor`:
    per block, the floor of the per-block rule (empty: not measured); `kept`: the export's kept tokens are known.
    Per image, a failing block comes first, then kept tokens swapped, then moved token counts, then |Δlogit|; a
    precision tie is judged on the blocks before its first deviation only, a near-tie not at all."""
    out: list[Failure] = []
    floor = block_floor or []
    stage_of = {b: s for s, b in enumerate(prune_at)}
    for r in rows:
        if not np.isfinite(logits_onnx[r.index]).all():
            out.append(Failure("non_finite", r.index, f"image {r.index} ({r.name}): non-finite ONNX logits"))
            continue
        if r.near_tie:
            continue
        # a precision tie's blocks before its first deviation are judged too (past it the drift is not compared)
        bi, within = first_failing_block(r.block_drift, floor, th) if floor else (None, 0.0)
        if bi is not None:
            text = block_failure_text(r, floor, th, stage_of, kept)
            out.append(Failure("block_drift", r.index, f"image {r.index} ({r.name}): {text}"))
        if r.precision_tie:
            continue
        if r.index in (swaps or {}):
            out.append(Failure("kept_tokens", r.index, f"image {r.index} ({r.name}): {(swaps or {})[r.index]}"))
        if not r.counts_agree:
            stage = first_moved_stage(r.counts_onnx, r.counts_reference)
            why = (moved_notes or {}).get(r.index, f"stage {stage}")
            out.append(
                Failure(
                    "token_counts",
                    r.index,
                    f"image {r.index} ({r.name}): token_counts {r.counts_onnx} != reference {r.counts_reference}, "
                    f"moved at {why}",
                )
            )
        if not th.passes(r.max_abs_diff, r.ref_max_abs_logit):
            bar = f"{'>' if th.rel_logit else '>='} {th.bound(r.ref_max_abs_logit):.4g}"
            head = ""
            if floor and bi is None and r.counts_agree:
                head = f"; every block within {within:.2g}x its floor: the fault is past the last block (the head)"
            msg = f"image {r.index} ({r.name}): max |Δlogit| {r.max_abs_diff:.3e} {bar}{head}"
            out.append(Failure("max_abs_logit", r.index, msg))
    judged = [r for r in rows if not (r.near_tie or r.precision_tie)]
    if judged:
        agree = sum(r.top1_agree for r in judged) / len(judged)
        if agree < th.min_top1:
            bad = [r.index for r in judged if not r.top1_agree]
            out.append(Failure("top1", None, f"top-1 agreement {agree:.1%} < {th.min_top1:.0%} (images {bad})"))
    elif rows:  # every image excused: nothing was compared, which must not read as a pass
        out.append(Failure("none_judged", None, f"no image judged: all {len(rows)} are near-ties or precision ties"))
    return out
