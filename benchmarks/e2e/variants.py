"""The benchmarked variants as (run, results) steps on one input batch.

A step is `run()` (the timed call, data already on the device) plus `results()` -> (logits [B, classes],
token_counts [B, stages] int64 or None) read after a run.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnxruntime as ort
import torch
from torch import nn

from benchmarks.e2e.ort_run import BoundRun
from raggedvit.pruning import PrunedOutput, PruneSpec, build_pruned_vit
from tests.support.padded import padded_reference_forward

__all__ = ["Step", "export_ragged", "ort_step", "torch_model_fn", "torch_step"]

Results = tuple[torch.Tensor, "torch.Tensor | None"]
Step = tuple[Callable[[], None], Callable[[], Results]]


def torch_step(fn: Callable[[torch.Tensor], Any], images: torch.Tensor) -> Step:
    """fn(images) -> logits tensor or PrunedOutput."""
    box: dict[str, Any] = {}

    def run() -> None:
        box["out"] = fn(images)

    def results() -> Results:
        out = box["out"]
        if isinstance(out, PrunedOutput):
            return out.logits, out.token_counts
        return out, None

    return run, results


def ort_step(session: ort.InferenceSession, images: torch.Tensor) -> Step:
    """Session bound once to images (float32 on the device) and preallocated outputs."""
    bound = BoundRun(session, images)

    def results() -> Results:
        outs = bound.outputs()
        return outs["logits"], outs.get("token_counts")

    return bound.run, results


def torch_model_fn(
    variant: str, vit: nn.Module, spec: PruneSpec | None, attention: Callable[..., Any] | None = None
) -> Callable[[torch.Tensor], Any]:
    """images -> output for the torch variants (vit already in the benchmark dtype on the device)."""
    if variant == "timm_eager_fp16":
        return vit
    assert spec is not None
    if variant == "torch_padded_sdpa":
        return lambda x: padded_reference_forward(vit, spec, x, attention="sdpa", shrink=True)
    if variant == "torch_raggedvit":
        return build_pruned_vit(vit, spec).eval()
    if variant == "torch_varlen":
        if attention is None:
            raise ValueError("torch_varlen needs the varlen attention hook")
        return build_pruned_vit(vit, spec, attention=attention).eval()
    raise ValueError(f"{variant!r} is not a torch variant")


def export_ragged(vit: nn.Module, spec: PruneSpec, path: Path, *, dtype: str, recipe: dict[str, Any]) -> Path:
    """raggedvit.exporter.export_onnx of the float32 CPU model (weights cast by the exporter for fp16)."""
    from raggedvit.exporter import export_onnx

    return export_onnx(vit, spec, path, dtype=dtype, recipe=recipe)
