"""Kept tokens, not just counts: every export names its stages' kept tokens (recipe "stage_outputs"), so validate
tells one token swapped at a cut by rounding (a precision tie) from a fault, without diagnostic outputs."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper

from raggedvit.exporter import export_onnx, read_recipe
from raggedvit.exporter.metadata import write_recipe
from raggedvit.images import preprocess, sample_images
from raggedvit.pruning import PrunedViT, PruneSpec
from raggedvit.validators import Thresholds
from raggedvit.validators.compare import validate
from raggedvit.validators.ties import cut_gaps
from raggedvit.weights import load_vit

SPEC = PruneSpec("topk-l2", (2,), keep=0.5)


@pytest.fixture(scope="module")
def setup():
    vit, _ = load_vit("deit_tiny_patch16_224", seed=0, model_kwargs={"depth": 4})
    pairs = sample_images()
    return vit, preprocess(pairs, vit), [name for name, _ in pairs]


def _run(vit, export_vit, images, names, path, diagnostics=False):
    export_onnx(export_vit, SPEC, path, diagnostics=diagnostics, recipe={"model": "deit_tiny_patch16_224"})
    return validate(path, images, names, vit=vit, spec=SPEC, recipe=read_recipe(path))


@pytest.mark.parametrize("diagnostics", [False, True], ids=["plain", "diagnostics"])
def test_same_tokens_no_swaps(setup, tmp_path, diagnostics):
    vit, images, names = setup
    report = _run(vit, vit, images, names, tmp_path / "m.onnx", diagnostics)
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
    assert "swapped; reference score gap between them" in text and names[swapped[0].image] in text
    assert report.to_dict()["token_swaps"]
    assert not report.passed and "block 1 drifts" in report.failures[0].message  # the fault, before the stage


def _forced_swap(path, out_path, row: int) -> None:
    """A copy of the export whose stage-0 score of packed row `row` is 1e30: that token is kept, the export's
    lowest-scored kept token of its image is dropped (the count stays)."""
    model = onnx.load(str(path))
    src = read_recipe(model)["stage_outputs"][0][0]
    at, select = next((i, n) for i, n in enumerate(model.graph.node) if src in n.output)
    assert select.op_type == "RaggedSelect"
    model.graph.initializer.extend(
        [
            numpy_helper.from_array(np.array([row], np.int64), "forced_row"),
            numpy_helper.from_array(np.array([1e30], np.float32), "forced_score"),
        ]
    )
    scatter = helper.make_node(
        "ScatterElements", [select.input[0], "forced_row", "forced_score"], ["forced_scores"], axis=0
    )
    select.input[0] = "forced_scores"
    model.graph.node.insert(at, scatter)
    onnx.save(model, str(out_path))


@pytest.fixture(scope="module")
def forced(setup, tmp_path_factory):
    """(exports, image) of an fp32 export without diagnostic outputs: the unmutated file and two copies that keep
    one other token of `image`, the image whose reference cut gap is smallest: its first dropped token ("tie": a
    gap within the fp16 precision margin) and its lowest-scored patch token ("far")."""
    vit, images, _ = setup
    tmp = tmp_path_factory.mktemp("forced")
    path = export_onnx(vit, SPEC, tmp / "m.onnx", recipe={"model": "deit_tiny_patch16_224"})
    assert not any(o.name.startswith("token_index") for o in onnx.load(str(path)).graph.output)
    with torch.no_grad():
        model = PrunedViT(vit, SPEC)
        trace = model(images).stages[0]
    gap, _ = cut_gaps(trace.scores, trace.n, trace.k, model.num_prefix, SPEC)
    image = int(torch.argmin(gap))
    eps = Thresholds.for_dtype("fp16").precision_eps
    assert 1e-5 < float(gap[image]) < eps, f"no sample photo has a cut gap within fp16 precision: {gap.tolist()}"
    order = torch.sort(trace.scores[image], descending=True, stable=True).indices
    patches = int(trace.n[image]) - model.num_prefix
    first_dropped, last = int(order[int(trace.k[image])]), int(order[patches - 1])
    tokens = int(trace.n[image])
    exports = {"clean": path}
    for what, token in (("tie", first_dropped), ("far", last)):
        exports[what] = tmp / f"{what}.onnx"
        _forced_swap(path, exports[what], image * tokens + token)
    return exports, image


def _validate(setup, path, dtype_rule, recipe=None):
    vit, images, names = setup
    stored = recipe or read_recipe(path)
    th = Thresholds.for_dtype(dtype_rule)  # an fp32 export judged by the fp16 rule: the swap is the only rounding
    return validate(path, images, names, vit=vit, spec=SPEC, recipe=stored, thresholds=th, floor=False)


def test_a_forced_swap_at_a_tie_is_a_precision_tie_not_a_block_failure(setup, forced):
    exports, image = forced
    report = _validate(setup, exports["tie"], "fp16")
    assert report.passed, report.to_markdown()
    (tie,) = report.precision_ties
    assert (tie.image, tie.stage, tie.block, tie.kind) == (image, 0, 2, "swap")
    assert tie.gap < report.thresholds.precision_eps
    row = report.rows[image]
    assert row.precision_tie and row.counts_agree and [t.swapped for t in row.token_swaps] == [1]
    assert all(d is None for d in row.block_drift[2:])  # other rows: no drift compared past the cut
    assert [r.index for r in report.rows if r.precision_tie] == [image]
    assert "1 token swapped; reference score gap between them" in report.to_markdown()


def test_without_the_stage_outputs_the_same_swap_reads_as_drift(setup, forced):
    """An export older than the recipe's "stage_outputs" (no diagnostic outputs): equal counts stand for equal
    sets, so the swap shows as drift of the first block after the cut, whose failure says to re-export."""
    exports, image = forced
    model = onnx.load(str(exports["tie"]))
    recipe = read_recipe(model)
    del recipe["stage_outputs"]
    write_recipe(model, recipe)
    old = exports["tie"].with_name("old.onnx")
    onnx.save(model, str(old))
    report = _validate(setup, old, "fp16", recipe)
    assert not report.passed and not report.precision_ties
    failure = next(f for f in report.failures if f.image == image)  # the first failure of the image
    assert {f.image for f in report.failures if f.image is not None} == {image}
    assert failure.kind == "block_drift" and "block 2 (the first block after stage 0)" in failure.message
    assert "re-export with this raggedvit" in failure.message


@pytest.mark.parametrize(("what", "rule"), [("far", "fp16"), ("tie", "fp32")])
def test_a_swap_beyond_rounding_fails_naming_image_and_stage(setup, forced, what, rule):
    """A token kept far from the cut (any dtype), or any swap off a near-tie under the fp32 rule: a fault."""
    exports, image = forced
    names = setup[2]
    report = _validate(setup, exports[what], rule)
    assert not report.passed and not report.precision_ties
    first = next(f for f in report.failures if f.image == image)
    assert first.kind == "kept_tokens", report.to_markdown()
    assert first.message.startswith(f"image {image} ({names[image]}): stage 0 (block 2) kept 1 other token")
    margin = "precision margin 0.00391" if rule == "fp16" else "near-tie margin 1e-05"
    assert margin in first.message
    assert {f.image for f in report.failures if f.image is not None} == {image}


def test_the_unmutated_export_passes_both_rules(setup, forced):
    exports, _ = forced
    for rule in ("fp16", "fp32"):
        report = _validate(setup, exports["clean"], rule)
        assert report.passed and not report.precision_ties, report.to_markdown()
