"""Precision floor: how far PyTorch itself moves from its own fp32 logits at an export's reduced dtype.

An fp16 export stores its weights in fp16 and rounds its activations to fp16; the validator compares it with
the fp32 PyTorch reference. Two measurements on the same images tell an export bug from the limit of the
dtype:

- weights: the fp32 reference with every parameter rounded to the export dtype (and back). This is a fixed
  change to the network that every fp16 runtime makes (ORT, TensorRT, `model.half()`); no fp16 export can be
  closer to the fp32 reference than this by construction, apart from cancellation.
- torch: PyTorch's own forward of the same pruned model in the export dtype (`model.half()` on CPU).

Both run the packed PrunedViT on CPU, like the reference. Where a floor run kept other token counts than the
reference (a pruning cut moved), its |Δlogit| measures a different selection, not arithmetic: such images are
flagged and left out of the floor summary.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from raggedvit.pruning import PruneSpec
from raggedvit.validators.reference import run_reference

__all__ = ["FLOOR_DTYPES", "PrecisionFloor", "precision_floor"]

FLOOR_DTYPES: dict[str, torch.dtype] = {"fp16": torch.float16, "fp16-all": torch.float16}


@dataclass(frozen=True)
class PrecisionFloor:
    """Per-image max |Δlogit| against the fp32 reference: `weights` [N] with parameters rounded to `dtype`,
    `torch` [N] of PyTorch's forward in `dtype`; `*_same_counts` [N]: that run kept the reference's token counts."""

    dtype: str
    weights: list[float]
    torch: list[float]
    weights_same_counts: list[bool]
    torch_same_counts: list[bool]


def _max_abs(a: np.ndarray, b: np.ndarray) -> list[float]:
    d = np.abs(a.astype(np.float64) - b.astype(np.float64))
    return [float(np.nanmax(row)) if row.size else 0.0 for row in d]


def precision_floor(
    vit: nn.Module,
    spec: PruneSpec,
    images: torch.Tensor,
    logits_reference: np.ndarray,
    counts_reference: np.ndarray,
    dtype: str,
    *,
    batch_size: int = 16,
) -> PrecisionFloor | None:
    """The precision floor of `dtype` (an export dtype name) on `images` [N, 3, S, S] float32 (CPU).

    `logits_reference` [N, classes], `counts_reference` [N, stages]: the fp32 reference's outputs on the same
    images. None for an export dtype without reduced precision (fp32).
    """
    low = FLOOR_DTYPES.get(dtype)
    if low is None:
        return None
    rounded = copy.deepcopy(vit).eval()
    for p in rounded.parameters():
        p.data = p.data.to(low).to(p.dtype)
    lg_w, tc_w = run_reference(rounded, spec, images, batch_size)
    del rounded
    lg_t, tc_t = run_reference(copy.deepcopy(vit).eval().to(low), spec, images.to(low), batch_size)
    return PrecisionFloor(
        dtype=dtype,
        weights=_max_abs(lg_w, logits_reference),
        torch=_max_abs(lg_t, logits_reference),
        weights_same_counts=[bool(v) for v in (tc_w == counts_reference).all(axis=1)],
        torch_same_counts=[bool(v) for v in (tc_t == counts_reference).all(axis=1)],
    )
