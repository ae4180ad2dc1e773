"""Kept tokens, not just counts: with diagnostic outputs the validator names images whose cut kept other tokens."""

from __future__ import annotations

import copy

import pytest
import torch

from raggedvit.exporter import export_onnx, read_recipe
from raggedvit.images import preprocess, sample_images
from raggedvit.pruning import PruneSpec
from raggedvit.validators.compare import validate
from raggedvit.weights import load_vit

SPEC = PruneSpec("topk-l2", (2,), keep=0.5)


@pytest.fixture(scope="module")
def setup():
    vit, _ = load_vit("deit_tiny_patch16_224", seed=0, model_kwargs={"depth": 4})
    pairs = sample_images()
    return vit, preprocess(pairs, vit), [name for name, _ in pairs]


def _run(vit, export_vit, images, names, path):
    export_onnx(export_vit, SPEC, path, diagnostics=True, recipe={"model": "deit_tiny_patch16_224"})
    return validate(path, images, names, vit=vit, spec=SPEC, recipe=read_recipe(path))


def test_same_tokens_no_swaps(setup, tmp_path):
    vit, images, names = setup
    report = _run(vit, vit, images, names, tmp_path / "m.onnx")
    assert report.passed and not any(r.token_swaps for r in report.rows)


def test_swapped_tokens_are_named_with_the_gap(setup, tmp_path):
    vit, images, names = setup
    mutant = copy.deepcopy(vit)
    with torch.no_grad():
        mutant.blocks[1].mlp.fc2.weight.mul_(1.3)  # other scores before the stage, the same count (topk-l2)
    report = _run(vit, mutant, images, names, tmp_path / "m.onnx")
    swapped = [t for r in report.rows for t in r.token_swaps]
    assert swapped and all(t.stage == 0 and t.block == 2 and t.swapped >= 1 for t in swapped)
    assert all(r.counts_agree for r in report.rows)
    text = report.to_markdown()
    assert "swapped; reference score gap" in text and names[swapped[0].image] in text
    assert report.to_dict()["token_swaps"]
