"""One small export of every export kind: tome, evit, evit+fuse, cls-mass (compact and capacity), topk-l2 and a
relative-position family, each in fp32, fp16 and fp16-all (scripts/ort_cuda_signatures.py
collects their node signatures; tests/exporter/test_placement.py checks them). The deit_tiny_d3 kinds have timm's
initial weights, whose Linear biases are zero (torch.onnx drops them: no bias reaches the rules); topk-l2-biased has
the biases, norms and tokens of a trained checkpoint (perturb_biases_and_norms_), so the rewrites of a biased GEMM
(SkipLayerNormalization with its bias input, BiasGelu) that every real checkpoint's export has are among the
signatures (a biased tome export adds none to these)."""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pruning"))
from _pruning_models import get_model  # noqa: E402
from _relpos_models import build as relpos_model  # noqa: E402

from raggedvit.exporter import export_onnx  # noqa: E402
from raggedvit.pruning import PruneSpec  # noqa: E402
from raggedvit.weights import perturb_biases_and_norms_  # noqa: E402

__all__ = ["DTYPES", "KINDS", "export_kind", "export_kinds"]

DTYPES = ("fp32", "fp16", "fp16-all")
# name: (model key, spec, capacity); depth-3 models: every stage kind runs, the signatures are those of a full model
KINDS = {
    "tome": ("deit_tiny_d3", PruneSpec("tome", r=8), False),
    "evit": ("deit_tiny_d3", PruneSpec("evit", (1, 2), keep=0.6), False),
    "evit-fuse": ("deit_tiny_d3", PruneSpec("evit", (1, 2), keep=0.6, fuse=True), False),
    "cls-mass": ("deit_tiny_d3", PruneSpec("cls-mass", (1, 2), mass=0.8), False),
    "cls-mass-capacity": ("deit_tiny_d3", PruneSpec("cls-mass", (1, 2), mass=0.8), True),
    "topk-l2": ("deit_tiny_d3", PruneSpec("topk-l2", (1, 2), keep=0.6), False),
    "topk-l2-biased": ("deit_tiny_d3+biases", PruneSpec("topk-l2", (1, 2), keep=0.6), False),
    "relpos": ("relpos:srelpos-bias-qknorm", PruneSpec("topk-l2", (1,), keep=0.6), False),  # 2 blocks
}


def _model(key: str) -> torch.nn.Module:
    if key.startswith("relpos:"):
        return relpos_model(key.split(":", 1)[1])
    if key.endswith("+biases"):  # a copy: get_model's models are shared
        return perturb_biases_and_norms_(copy.deepcopy(get_model(key.removesuffix("+biases"))), seed=0)
    return get_model(key)


def export_kind(kind: str, dtype: str, folder: Path) -> Path:
    """The export of `kind` in `dtype` under `folder` (its path)."""
    key, spec, capacity = KINDS[kind]
    return export_onnx(_model(key), spec, folder / f"{kind}_{dtype}.onnx", dtype=dtype, capacity=capacity)


def export_kinds(folder: Path) -> Iterator[tuple[str, str, Path]]:
    """(kind, dtype, path) of every kind x dtype, exported under `folder`."""
    for kind in KINDS:
        for dtype in DTYPES:
            yield kind, dtype, export_kind(kind, dtype, folder)
