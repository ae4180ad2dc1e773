"""validate() end to end on an exported DeiT-Tiny: ORT CPU EP vs the reference rebuilt from the recipe."""

from __future__ import annotations

import pytest
import torch

from raggedvit.exporter import export_onnx
from raggedvit.images import preprocess, sample_images
from raggedvit.pruning import PrunedViT, PruneSpec
from raggedvit.validators import (
    Thresholds,
    ValidationInputError,
    load_recipe,
    load_reference,
    validate,
)
from raggedvit.weights import load_vit

# one pytest-xdist worker runs this module (`--dist loadgroup`), so its module fixtures run once
pytestmark = pytest.mark.xdist_group("test_validate")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    vit, info = load_vit("deit_tiny_patch16_224", seed=0)
    path = tmp_path_factory.mktemp("v") / "cls_mass.onnx"
    export_onnx(
        vit,
        PruneSpec("cls-mass", (3, 6, 9)),
        path,
        recipe={"model": "deit_tiny_patch16_224", "weights": info.to_dict()},
    )
    return path


def test_validate_passes_and_rebuilds_reference(exported):
    recipe = load_recipe(exported)
    vit, spec = load_reference(recipe)
    pairs = sample_images()[:4]
    report = validate(exported, preprocess(pairs, vit), [n for n, _ in pairs], vit=vit, spec=spec, recipe=recipe)
    assert report.passed, report.to_markdown()
    assert report.max_abs_diff < 1e-4 and report.counts_agreement == 1.0 and report.top1_agreement == 1.0
    assert [r.name for r in report.rows] == [n for n, _ in pairs]
    with torch.no_grad():
        ref_scale = float(PrunedViT(vit, spec)(preprocess(pairs, vit)).logits.abs().max())
    assert report.ref_max_abs_logit == pytest.approx(ref_scale, rel=1e-5)
    assert report.to_dict()["summary"]["reference_max_abs_logit"] == report.ref_max_abs_logit
    assert "reference logits: max |logit|" in report.to_markdown()
    strict = validate(
        exported,
        preprocess(pairs, vit),
        [n for n, _ in pairs],
        vit=vit,
        spec=spec,
        recipe=recipe,
        thresholds=Thresholds(max_abs_logit=1e-12, tie_eps=0.0),
    )
    assert not strict.passed and {f.kind for f in strict.failures} == {"max_abs_logit"}


def test_recipe_errors(tmp_path):
    with pytest.raises(ValidationInputError, match="does not exist"):
        load_recipe(tmp_path / "nope.onnx")
    (tmp_path / "bad.onnx").write_bytes(b"not a model")
    with pytest.raises(ValidationInputError, match="not a readable ONNX model"):
        load_recipe(tmp_path / "bad.onnx")
    with pytest.raises(ValidationInputError, match="not found"):
        load_reference(
            {
                "model": "deit_tiny_patch16_224",
                "img_size": 224,
                "prune": {"policy": "none"},
                "weights": {"source": "checkpoint", "checkpoint": "gone.pth"},
            }
        )
    with pytest.raises(ValidationInputError, match="the export has 4 blocks but timm's deit_tiny_patch16_224 has 12"):
        load_reference(
            {
                "model": "deit_tiny_patch16_224",
                "img_size": 224,
                "depth": 4,
                "prune": {"policy": "none"},
                "weights": {"source": "seeded", "seed": 0},
            }
        )


def test_fp16_export_validates_on_the_cpu_ep(tmp_path):
    """ORT's CPU kernels run a float16 export: the per-block rule reads it against PyTorch's fp16 floor."""
    vit, info = load_vit("deit_tiny_patch16_224", seed=0, img_size=64)
    spec = PruneSpec("topk-l2", (1, 2), keep=0.5)
    path = export_onnx(
        vit,
        spec,
        tmp_path / "fp16.onnx",
        dtype="fp16",
        recipe={"model": "deit_tiny_patch16_224", "weights": info.to_dict()},
    )
    images = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    report = validate(path, images, ["a", "b"], vit=vit, spec=spec, recipe=load_recipe(path), floor=False)
    assert report.passed, report.to_markdown()
    assert len(report.block_floor) == 12 and all(f for f in report.block_floor)
    assert "| block | max drift | fp16 floor | ratio |" in report.to_markdown()


@pytest.mark.parametrize("capacity", [False, True], ids=["compact", "capacity"])
def test_per_block_drift_on_fused_and_capacity_rows(tmp_path, capacity):
    """evit + fuse (a fused token per image, data-dependent counts) with diagnostic outputs (the export's kept
    token indices are compared): every block measured and within its floor; a recipe without block outputs is
    judged without the per-block rule, and says so."""
    vit, info = load_vit("deit_tiny_patch16_224", seed=0, img_size=64)
    spec = PruneSpec("evit", (1, 2), keep=0.6, fuse=True)
    recipe = {"model": "deit_tiny_patch16_224", "weights": info.to_dict()}
    path = export_onnx(vit, spec, tmp_path / "m.onnx", recipe=recipe, diagnostics=True, capacity=capacity)
    images = torch.randn(3, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    stored = load_recipe(path)
    report = validate(path, images, ["a", "b", "c"], vit=vit, spec=spec, recipe=stored)
    assert report.passed, report.to_markdown()
    assert all(None not in r.block_drift for r in report.rows) and len(report.block_floor) == 12
    assert report.block_summary().startswith("every block within")
    old = validate(path, images, ["a", "b", "c"], vit=vit, spec=spec, recipe={**stored, "block_outputs": []})
    assert old.passed and not old.block_floor and "names no block output tensors" in old.to_markdown()
