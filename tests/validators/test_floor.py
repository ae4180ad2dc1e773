"""Precision floor of reduced-precision exports: PyTorch itself against its fp32 logits."""

from __future__ import annotations

import json

import pytest
import torch

from raggedvit.exporter import export_onnx
from raggedvit.images import preprocess, sample_images
from raggedvit.pruning import PruneSpec
from raggedvit.validators import (
    ValidationInputError,
    load_recipe,
    load_reference,
    precision_floor,
    run_reference,
    validate,
)
from raggedvit.weights import load_vit

SPEC = PruneSpec("topk-l2", (4,), keep=0.5)


# one pytest-xdist worker runs this module (`--dist loadgroup`), so its module fixtures run once
pytestmark = pytest.mark.xdist_group("test_floor")


@pytest.fixture(scope="module")
def tiny():
    vit, info = load_vit("deit_tiny_patch16_224", seed=0)
    return vit, info


@pytest.fixture(scope="module")
def images(tiny):
    return preprocess(sample_images()[:3], tiny[0])


def test_no_floor_for_fp32(tiny, images):
    assert precision_floor(tiny[0], SPEC, images, *run_reference(tiny[0], SPEC, images), "fp32") is None


def test_fp16_floor_measures_rounded_weights_and_half_forward(tiny, images):
    vit, _ = tiny
    before = [p.detach().clone() for p in vit.parameters()]
    fl = precision_floor(vit, SPEC, images, *run_reference(vit, SPEC, images), "fp16")
    assert fl is not None and fl.dtype == "fp16" and len(fl.weights) == len(fl.torch) == 3
    # fp16 rounding moves the logits, but only by fp16-sized amounts (deit_tiny logits are ~1)
    assert all(1e-6 < w < 2e-2 for w in fl.weights), fl
    assert all(1e-6 < t < 2e-2 for t in fl.torch), fl
    assert fl.weights_same_counts == fl.torch_same_counts == [True] * 3  # topk-l2: counts are fixed
    assert all(torch.equal(a, b) for a, b in zip(before, vit.parameters())), "the reference model was modified"
    assert all(p.dtype == torch.float32 for p in vit.parameters())


@pytest.fixture(scope="module")
def exported(tiny, tmp_path_factory):
    vit, info = tiny
    out = {}
    for dtype in ("fp32", "fp16"):
        path = tmp_path_factory.mktemp("floor") / f"{dtype}.onnx"
        recipe = {"model": "deit_tiny_patch16_224", "weights": info.to_dict()}
        out[dtype] = export_onnx(vit, SPEC, path, dtype=dtype, recipe=recipe)
    return out


def _validate(path, images, **kw):
    recipe = load_recipe(path)
    vit, spec = load_reference(recipe)
    return validate(path, images, ["a", "b", "c"], vit=vit, spec=spec, recipe=recipe, **kw)


def test_fp16_report_carries_the_floor(exported, images):
    report = _validate(exported["fp16"], images)
    assert report.has_floor and all(r.floor_weights is not None and r.floor_torch is not None for r in report.rows)
    summary = report.to_dict()["summary"]["precision_floor"]
    assert set(summary) == {
        "export_max_abs_diff",
        "weights_max_abs_diff",
        "torch_max_abs_diff",
        "images",
        "export_other_counts",
        "weights_other_counts",
        "torch_other_counts",
        "within_torch_fp16",
    }
    assert summary["images"] == 3 and summary["weights_other_counts"] == summary["torch_other_counts"] == 0
    assert summary["export_other_counts"] == 0
    assert summary["export_max_abs_diff"] == pytest.approx(report.max_abs_diff)  # no near-ties here
    md = report.to_markdown()
    assert "precision floor of fp16" in md and "| floor: weights | floor: torch |" in md
    json.loads(report.to_json())
    plain = _validate(exported["fp16"], images, floor=False)
    assert not plain.has_floor and "precision floor" not in plain.to_markdown()
    assert plain.to_dict()["summary"]["precision_floor"] is None
    assert [r.max_abs_diff for r in plain.rows] == [r.max_abs_diff for r in report.rows]


def test_fp32_export_has_no_floor(exported, images):
    report = _validate(exported["fp32"], images)
    assert not report.has_floor and report.passed
    with pytest.raises(ValidationInputError, match="no precision floor"):
        _validate(exported["fp32"], images, floor=True)
