"""Report content (JSON / Markdown), failure typing, and near-tie gaps."""

from __future__ import annotations

import json
import math

import pytest
import torch

from raggedvit.pruning import PruneSpec
from raggedvit.validators import Failure, ImageRow, NearTie, Thresholds, ValidationReport, cut_gaps
from raggedvit.validators.compare import _failures


def _row(i, diff=1e-6, top=(3, 3), counts=([99], [99]), tie=False):
    return ImageRow(i, f"img{i}", diff, diff / 2, top[0], top[1], list(counts[0]), list(counts[1]), tie)


def _report(rows, ties=()):
    rep = ValidationReport(
        "m.onnx",
        {"model": "deit", "prune": {"policy": "topk-l2", "prune_at": [4], "keep": 0.5}},
        "cpu",
        ["CPUExecutionProvider"],
        Thresholds(),
        rows=rows,
        near_ties=list(ties),
    )
    rep.failures.extend(_failures(rows, torch.zeros(len(rows), 4).numpy(), rep.thresholds))
    return rep


def test_passing_report_json_and_markdown(tmp_path):
    rep = _report([_row(0), _row(1)])
    assert rep.passed
    js, md = rep.write(tmp_path / "rep.json")
    assert (js.name, md.name) == ("rep.json", "rep.md")
    data = json.loads(js.read_text())
    assert data["passed"] is True and data["summary"]["images"] == 2 and data["summary"]["top1_agreement"] == 1.0
    assert data["rows"][0]["counts_onnx"] == [99] and data["rows"][0]["top1_agree"] is True
    text = md.read_text()
    assert text.startswith("## raggedvit validation: PASS") and "| img1 |" in text
    assert "- pruning: topk-l2 keep=0.5 at=4" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep.json", "rep.md"]


def test_typed_failures():
    rep = _report([_row(0, diff=0.01), _row(1, top=(3, 4)), _row(2, counts=([99], [98]))])
    kinds = sorted((f.kind, f.image) for f in rep.failures)
    assert kinds == [("max_abs_logit", 0), ("token_counts", 2), ("top1", None)]
    assert not rep.passed and "## raggedvit validation: FAIL" in rep.to_markdown()
    assert all(isinstance(f, Failure) for f in rep.failures)


def test_a_run_with_no_judged_image_fails():
    import dataclasses

    rep = _report([_row(0, tie=True), dataclasses.replace(_row(1, counts=([98], [99])), precision_tie=True)])
    assert [(f.kind, f.image) for f in rep.failures] == [("none_judged", None)]
    assert "no image judged: all 2 are near-ties or precision ties" in rep.to_markdown()
    assert rep.to_dict()["summary"]["judged_images"] == 0


def test_near_tie_images_are_listed_not_failed():
    rep = _report(
        [_row(0, diff=0.5, top=(1, 2), counts=([98], [99]), tie=True), _row(1)], ties=[NearTie(0, 0, 4, "score", 1e-7)]
    )
    assert rep.passed
    assert "image 0, stage 0 (block 4): score gap 1.00e-07" in rep.to_markdown()


def test_cut_gaps():
    inf = float("-inf")
    S = torch.tensor([[inf, 5.0, 3.0, 4.0, 1.0], [inf, 0.5, 0.3, 0.2, inf]])
    n = torch.tensor([5, 4])
    k = torch.tensor([2, 3])  # image 1 keeps all its patches: no cut
    score_gap, mass_gap = cut_gaps(S, n, k, 1, PruneSpec("topk-l2", (4,)))
    # topk-l2 scores are squared L2 norms: the gap is of the norms (2 and sqrt 3)
    assert math.isclose(float(score_gap[0]), (2.0 - math.sqrt(3.0)) / 2.0)
    score_gap, _ = cut_gaps(S, n, k, 1, PruneSpec("evit", (4,)))
    assert math.isclose(float(score_gap[0]), (4.0 - 3.0) / 4.0)
    assert math.isinf(float(score_gap[1])) and math.isinf(float(mass_gap[0]))
    S = torch.tensor([[inf, 0.5, 0.4, 0.1]])  # exclusive mass: 0, 0.5, 0.9 -> with mass 0.9 the cut is at 0.9
    _, mass_gap = cut_gaps(S, torch.tensor([4]), torch.tensor([2]), 1, PruneSpec("cls-mass", (4,), mass=0.9))
    assert float(mass_gap[0]) < 1e-6


def test_floor_summary_leaves_out_ties_and_runs_with_other_counts():
    import dataclasses

    rows = [
        dataclasses.replace(_row(0, 5e-3), floor_weights=3e-3, floor_torch=6e-3),
        dataclasses.replace(_row(1, 4e-3), floor_weights=2e-3, floor_torch=0.4, floor_torch_same_counts=False),
        dataclasses.replace(_row(2, 0.3, tie=True), floor_weights=0.28, floor_torch=5e-3),
        # the export moved a cut (counts differ): a different selection, left out of the export's max
        dataclasses.replace(_row(3, 0.2, counts=([98], [99])), floor_weights=0.19, floor_torch=4e-3),
    ]
    rep = _report(rows)
    fl = rep.to_dict()["summary"]["precision_floor"]
    assert fl == {
        "export_max_abs_diff": 5e-3,
        "weights_max_abs_diff": 0.19,  # the weights run kept the reference's counts on image 3
        "torch_max_abs_diff": 6e-3,
        "images": 3,
        "export_other_counts": 1,
        "weights_other_counts": 0,
        "torch_other_counts": 1,
        "within_torch_fp16": True,  # compared on image 0 only (image 1: torch ≠, image 3: export ✗)
    }
    md = rep.to_markdown()
    assert "a |Δlogit| failure here is fp16 rounding, not an export fault" in md
    assert "| 4.000e-01 ≠ |" in md and "1 of the fp16 runs kept other token counts" in md
    assert "1 of the export's images and 1 of the fp16 runs" in md
    assert _report([_row(0)]).to_dict()["summary"]["precision_floor"] is None
    far = _report([dataclasses.replace(_row(0, 9e-3), floor_weights=3e-3, floor_torch=6e-3)])
    assert far.to_dict()["summary"]["precision_floor"]["within_torch_fp16"] is False
    assert "check the worst one for an export or kernel fault" in far.to_markdown()


def test_relative_logit_tolerance_scales_with_the_reference_logits():
    import dataclasses

    rows = [
        dataclasses.replace(_row(0, diff=0.02), ref_max_abs_logit=10.0),  # bar 0.004 + 0.002 * 10 = 0.024
        dataclasses.replace(_row(1, diff=0.02), ref_max_abs_logit=2.0),  # bar 0.008
    ]
    th = Thresholds(rel_logit=0.002)
    assert th.bound(10.0) == pytest.approx(0.024) and Thresholds().bound(10.0) == 0.004
    fails = _failures(rows, torch.zeros(2, 4).numpy(), th)
    assert [(f.kind, f.image) for f in fails] == [("max_abs_logit", 1)]
    assert "> 0.008" in fails[0].message  # a mixed bar passes at equality, like allclose
    assert th.passes(0.008, 2.0) and not Thresholds().passes(0.004, 2.0)
    rep = ValidationReport("m.onnx", {}, "cpu", [], th, rows=rows)
    assert "max |Δlogit| ≤ 0.004 + 0.002 x max |reference logit|" in rep.to_markdown()
    assert rep.to_dict()["thresholds"]["rel_logit"] == 0.002


def test_a_precision_tie_is_judged_on_the_blocks_before_its_deviation():
    """Logits and counts of a precision tie are not compared; its blocks before the first deviation are (drift None
    past it), so a fault upstream of the cut still fails the image. A near-tie is not judged at all."""
    import dataclasses

    floor = [1e-6, 1e-6, 1e-6]
    faulty = dataclasses.replace(_row(0, diff=9.0), precision_tie=True, block_drift=[1e-6, 1e-2, None])
    clean = dataclasses.replace(_row(1, diff=9.0), precision_tie=True, block_drift=[1e-6, 2e-6, None])
    near = dataclasses.replace(_row(2, diff=9.0), near_tie=True, block_drift=[1e-2, 1e-2, 1e-2])
    judged = dataclasses.replace(_row(3), block_drift=[1e-6, 1e-6, 1e-6])
    rows = [faulty, clean, near, judged]
    fails = _failures(rows, torch.zeros(4, 4).numpy(), Thresholds(), block_floor=floor)
    assert [(f.kind, f.image) for f in fails] == [("block_drift", 0)]
    assert "block 1 drifts 1e+04x its fp32 floor" in fails[0].message
    rep = ValidationReport("m.onnx", {}, "cpu", [], Thresholds(), rows=rows, block_floor=floor)
    assert [t["images_over"] for t in rep.block_table()] == [0, 1, 0]  # the near-tie is not read


def test_a_structure_failure_names_its_kind_once():
    rep = _report([_row(0)])
    rep.failures.append(Failure("structure", None, "structure: block 3: norm epsilon 0.0001 in the export, ..."))
    md = rep.to_markdown()
    assert "- structure: block 3: norm epsilon" in md and "structure: structure:" not in md
    assert Failure("top1", None, "agreement 0.5").line() == "top1: agreement 0.5"
