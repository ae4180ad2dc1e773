"""ORT vs PyTorch on the same images: |Δlogit|, top-1 and token_counts agreement, near-ties, pass/fail."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from torch import nn
from tqdm import tqdm

from raggedvit.pruning import PruneSpec
from raggedvit.validators.errors import ValidationInputError
from raggedvit.validators.floor import FLOOR_DTYPES, precision_floor
from raggedvit.validators.reference import run_reference
from raggedvit.validators.report import Failure, ImageRow, Thresholds, ValidationReport
from raggedvit.validators.session import open_session
from raggedvit.validators.ties import find_near_ties

__all__ = ["run_onnx", "validate"]


def run_onnx(session, images: torch.Tensor, batch_size: int = 16, progress: bool = False):
    """images [N, 3, S, S] -> (logits [N, classes] float32, token_counts [N, stages] int64) numpy, in batches."""
    logits, counts = [], []
    chunks = range(0, images.shape[0], batch_size)
    for s in tqdm(chunks, desc="onnxruntime", disable=None if progress else True, leave=False):
        lg, tc = session.run(["logits", "token_counts"], {"images": images[s : s + batch_size].numpy()})
        logits.append(lg)
        counts.append(tc)
    return np.concatenate(logits), np.concatenate(counts)


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
) -> ValidationReport:
    """Compare the ONNX model in ORT with the PyTorch reference on `images` [N, 3, S, S] float32 (CPU).

    Images with a near-tie at a pruning cut are listed and excluded from the failure criteria.
    `session`: an ORT session of `model_path` on `device` already opened by the caller (else one is opened).
    `floor`: also measure the precision floor of the export dtype (validators/floor.py); None = for reduced-precision
    exports (fp16, fp16-all) only. It does not change pass/fail.
    """
    th = thresholds or Thresholds()
    if session is None:
        session = open_session(model_path, device, recipe=recipe)
    images = images.to("cpu", torch.float32).contiguous()
    lg_o, tc_o = run_onnx(session, images, batch_size, progress)
    lg_r, tc_r = run_reference(vit, spec, images, batch_size, progress)
    ties = find_near_ties(vit, spec, images, th.tie_eps)
    tied = {t.image for t in ties}
    dtype = str(recipe.get("dtype", "fp32"))
    fl = precision_floor(vit, spec, images, lg_r, tc_r, dtype, batch_size=batch_size) if floor is not False else None
    if floor and fl is None:
        raise ValidationInputError(f"export dtype {dtype!r} has no precision floor (only {', '.join(FLOOR_DTYPES)})")
    report = ValidationReport(
        model=str(model_path),
        recipe=recipe,
        device=device,
        providers=list(session.get_providers()),
        thresholds=th,
        near_ties=ties,
    )
    for i, name in enumerate(names):
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
            )
        )
    report.failures.extend(_failures(report.rows, lg_o, th))
    return report


def _failures(rows: list[ImageRow], logits_onnx: np.ndarray, th: Thresholds) -> list[Failure]:
    out: list[Failure] = []
    for r in rows:
        if not np.isfinite(logits_onnx[r.index]).all():
            out.append(Failure("non_finite", r.index, f"image {r.index} ({r.name}): non-finite ONNX logits"))
            continue
        if r.near_tie:
            continue
        bound = th.bound(r.ref_max_abs_logit)
        if not r.max_abs_diff < bound:
            out.append(
                Failure(
                    "max_abs_logit",
                    r.index,
                    f"image {r.index} ({r.name}): max |Δlogit| {r.max_abs_diff:.3e} >= {bound:.4g}",
                )
            )
        if not r.counts_agree:
            out.append(
                Failure(
                    "token_counts",
                    r.index,
                    f"image {r.index} ({r.name}): token_counts {r.counts_onnx} != reference {r.counts_reference}",
                )
            )
    judged = [r for r in rows if not r.near_tie]
    if judged:
        agree = sum(r.top1_agree for r in judged) / len(judged)
        if agree < th.min_top1:
            bad = [r.index for r in judged if not r.top1_agree]
            out.append(Failure("top1", None, f"top-1 agreement {agree:.1%} < {th.min_top1:.0%} (images {bad})"))
    return out
