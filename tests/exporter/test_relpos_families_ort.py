"""BEiT and VisionTransformerRelPos exported (fp32) on the ORT CPU EP: policy none equals timm's forward, pruning
policies equal PrunedViT (token counts equal). Strong position tables (tests/pruning/_relpos_models.py) on a
non-square grid, so a wrong position in the graph shows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raggedvit.exporter import build_model
from raggedvit.pruning import PruneSpec
from tests.pruning._relpos_models import IMG, build

from ._pruned import diff_to_pruned

CASES = [
    ("beit", PruneSpec("cls-mass", (1,), mass=0.8)),
    ("relpos-swin-cls", PruneSpec("evit", (1,), keep=0.5, fuse=True)),
    ("relpos-rpn", PruneSpec("topk-l2", (1,), keep=0.5)),
]


def _images(batch: int = 3) -> torch.Tensor:
    return torch.randn(batch, 3, *IMG, generator=torch.Generator().manual_seed(2))


@pytest.mark.parametrize("name,spec", CASES, ids=[f"{n}-{s.policy}" for n, s in CASES])
def test_export_equals_pruned_vit(ort_session, name, spec):
    model, x = build(name), _images()
    logits, counts = ort_session(build_model(model, spec)).run(["logits", "token_counts"], {"images": x.numpy()})
    diff, scale = diff_to_pruned(logits, counts, model, spec, x)
    assert diff <= 1e-4 * scale


@pytest.mark.parametrize("name", ["beit-shared-abs-token", "srelpos-bias-qknorm"])
def test_policy_none_equals_timm(ort_session, name):
    model, x = build(name), _images()
    (logits,) = ort_session(build_model(model, PruneSpec())).run(["logits"], {"images": x.numpy()})
    with torch.no_grad():
        ref = model(x).numpy()
    assert float(np.abs(logits - ref).max()) <= 1e-4 * float(np.abs(ref).max())


@pytest.mark.parametrize("name,dtype", [("beit-shared-swiglu", "fp16"), ("relpos-swin-cls", "fp16-all")])
def test_half_recipes_on_ort_cpu(ort_session, name, dtype):
    """The fp16 recipes (float32 pos_table into the half op) run on ORT's CPU EP within fp16 rounding of timm."""
    model, x = build(name), _images()
    (logits,) = ort_session(build_model(model, PruneSpec(), dtype=dtype)).run(["logits"], {"images": x.numpy()})
    with torch.no_grad():
        ref = model(x).numpy()
    assert float(np.abs(logits - ref).max()) <= 1e-2 * float(np.abs(ref).max())
