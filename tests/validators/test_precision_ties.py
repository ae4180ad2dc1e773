"""Precision ties end to end: a cls-mass export whose mass is off by one fp16 ulp moves cuts by one token where
the reference's margin is that small. The fp16 rule lists those images as precision ties; the fp32 rule fails them;
a mass off by far more than the margin fails under both, naming image and stage."""

from __future__ import annotations

import dataclasses
import json

import pytest

from raggedvit.images import preprocess, sample_images
from raggedvit.pruning import PruneSpec
from raggedvit.validators import FP16_ULP, Thresholds, load_recipe, load_reference, validate
from raggedvit.validators.mutants import Mutant, export_mutant
from raggedvit.weights import load_vit

pytestmark = pytest.mark.slow  # seconds a test: scheduled first (tests/conftest.py)

SPEC = PruneSpec("cls-mass", (3, 6, 9), mass=0.9)


def _mass_off(ulps: int) -> Mutant:
    return Mutant(
        f"mass_{ulps}_ulps", lambda vit, spec: dataclasses.replace(spec, mass=spec.mass * (1 + ulps * FP16_ULP))
    )


@pytest.fixture(scope="module")
def setup():
    vit, info = load_vit("deit_tiny_patch16_224", seed=0)
    pairs = sample_images()
    return (
        vit,
        {"model": "deit_tiny_patch16_224", "weights": info.to_dict()},
        preprocess(pairs, vit),
        [n for n, _ in pairs],
    )


def _run(setup, tmp_path, ulps: int, dtype_rule: str):
    vit, recipe, images, names = setup
    path = export_mutant(_mass_off(ulps), vit, SPEC, recipe, tmp_path / f"m{ulps}.onnx")  # an fp32 export
    stored = load_recipe(path)
    ref, spec = load_reference(stored)
    th = Thresholds.for_dtype(dtype_rule)  # judged as if it were an export of `dtype_rule`
    return validate(path, images, names, vit=ref, spec=spec, recipe=stored, thresholds=th, floor=False)


def test_a_cut_moved_within_the_margin_is_a_precision_tie(setup, tmp_path):
    report = _run(setup, tmp_path, 1, "fp16")
    assert report.passed, report.to_markdown()
    assert report.precision_ties, "no cut moved: the test lost its point"
    assert report.judged, "every image excused: the run would fail as none_judged"
    eps = report.thresholds.precision_eps
    for t in report.precision_ties:
        row = report.rows[t.image]
        assert row.precision_tie and not row.counts_agree and t.kind == "mass" and t.gap < eps
        moved = [a - b for a, b in zip(row.counts_onnx, row.counts_reference) if a != b]
        assert abs(moved[0]) == 1
    assert {r.index for r in report.rows if r.precision_tie} == {t.image for t in report.precision_ties}
    md = report.to_markdown()
    assert (
        "Precision ties: the export moved a cut (or swapped one kept token at it) whose reference margin is < 0.00391"
        in md
    )
    assert "| precision |" in md
    data = json.loads(report.to_json())
    assert data["summary"]["precision_ties"] == len(report.precision_ties) and data["thresholds"]["dtype"] == "fp16"


def test_the_fp32_rule_fails_the_same_moved_cuts(setup, tmp_path):
    report = _run(setup, tmp_path, 1, "fp32")
    assert not report.passed and not report.precision_ties
    moved = [f for f in report.failures if f.kind == "token_counts"]
    assert moved and all("moved at stage" in f.message and ">= the near-tie margin 1e-05" in f.message for f in moved)


def test_a_cut_moved_beyond_the_margin_fails_naming_image_and_stage(setup, tmp_path):
    report = _run(setup, tmp_path, 32, "fp16")
    names = setup[3]
    assert not report.passed and not report.precision_ties
    moved = [f for f in report.failures if f.kind == "token_counts"]
    assert {f.image for f in moved} == set(range(len(names)))
    for f in moved:
        assert f"image {f.image} ({names[f.image]})" in f.message and "moved at stage 0 (block 3) by +" in f.message
