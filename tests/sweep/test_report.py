"""SweepResult: Pareto front, order, the CSV / Markdown / JSON forms and the chart, on made-up points."""

from __future__ import annotations

import csv
import io
import json

from PIL import Image

from raggedvit.sweep import PointResult, SweepResult
from raggedvit.sweep.plot import plot_png


def _point(label: str, img_per_s: float, agreement: float, top1: float | None = None) -> PointResult:
    policy, _, rest = label.partition(" ")
    params = dict(kv.split("=") for kv in rest.split()) if rest else {}
    return PointResult(
        key=label, label=label, policy=policy, params=params, spec={"policy": policy}, agreement=agreement,
        top1=top1, top5=None if top1 is None else min(1.0, top1 + 0.2), kl=1 - agreement,
        tokens=[] if policy == "none" else [50.0], gflops=1.0, flops_ratio=0.5, img_per_s=img_per_s,
        latency_ms=1.0, p10_ms=0.9, p90_ms=1.1, gpu_ms=None, runs=5, cuda_graph=False, seconds=1.0,
    )  # fmt: skip


def _result(labelled: bool = False) -> SweepResult:
    top = (lambda v: v) if labelled else (lambda v: None)
    points = [
        _point("none", 100, 1.0, top(0.8)),
        _point("topk-l2 keep=0.5", 180, 0.9, top(0.7)),
        _point("topk-l2 keep=0.7", 150, 0.95, top(0.6)),  # by top-1, dominated by keep=0.5
        _point("cls-mass mass=0.9", 120, 0.85, top(0.9)),  # by agreement, dominated by keep=0.5
        _point("cls-mass mass=0.8", 170, 0.9, top(0.5)),  # dominated by keep=0.5 either way
    ]
    images = {"source": "x", "count": 10, "labelled": labelled, "digest": "0"}
    settings = {"model": "m", "weights": {"source": "seeded"}, "dtype": "fp32", "batch": 8, "device": "cpu"}
    return SweepResult({**settings, "device_name": "cpu", "images": images}, points)


def test_pareto_front_by_agreement_and_by_top1() -> None:
    r = _result()
    assert r.metric == "agreement"
    assert r.pareto() == {"none", "topk-l2 keep=0.5", "topk-l2 keep=0.7"}
    assert [p.label for p in r.by_speed()][:2] == ["topk-l2 keep=0.5", "cls-mass mass=0.8"]
    assert r.speedup(r.points[1]) == 1.8
    labelled = _result(labelled=True)
    assert labelled.metric == "top1"
    assert labelled.pareto() == {"topk-l2 keep=0.5", "cls-mass mass=0.9"}  # none is slower and worse than mass=0.9


def test_csv_markdown_and_json_forms() -> None:
    r = _result(labelled=True)
    rows = list(csv.DictReader(io.StringIO(r.to_csv())))
    assert [row["label"] for row in rows] == [p.label for p in r.by_speed()]
    assert rows[0]["keep"] == "0.5" and rows[0]["mass"] == "" and rows[0]["pareto"] == "1"
    assert rows[0]["speedup"] == "1.8" and rows[0]["top1"] == "0.7"
    md = r.to_markdown()
    assert "| ● | topk-l2 keep=0.5 | 180.0 | 1.80x |" in md and "| top-1 | top-5 |" in md
    assert "|  | cls-mass mass=0.8 |" in md
    assert "says nothing about accuracy on trained ones" in md
    assert "top-1" not in _result().to_markdown().splitlines()[4]  # the header row: no accuracy columns
    data = json.loads(json.dumps(r.to_dict()))
    assert data["metric"] == "top1" and [p["pareto"] for p in data["points"]] == [False, True, False, True, False]
    back = SweepResult.from_dict(data)
    assert back.points == r.points and back.settings == r.settings


def test_chart_is_a_png_that_decodes() -> None:
    png = plot_png(_result())
    with Image.open(io.BytesIO(png)) as im:
        im.load()
        assert im.format == "PNG" and im.size[0] > 500


def test_kl_never_prints_negative() -> None:
    """float rounding leaves KL(unpruned || unpruned) a hair below 0: printed 0.0000, not -0.0000."""
    r = _result()
    r.points[0] = PointResult(**{**r.points[0].__dict__, "kl": -3e-9})
    assert "-0.0000" not in r.to_markdown() and "-3e-09" not in r.to_csv()


def test_a_point_equal_to_a_measured_one() -> None:
    """A point equal to a measured one (same_as) is a row of the table and the CSV, labelled as that point, but not a
    point of the Pareto front or the chart; a sweep.json written before same_as existed still loads."""
    r = _result()
    keep5 = r.points[1]
    twin = PointResult(**{**keep5.__dict__, "key": "topk-l2 keep=0.51", "label": "topk-l2 keep=0.51",
                          "seconds": 0.0, "same_as": keep5.key})  # fmt: skip
    r.points.append(twin)
    assert r.pareto() == {"none", "topk-l2 keep=0.5", "topk-l2 keep=0.7"} and r.measured() == r.points[:-1]
    assert "|  | topk-l2 keep=0.51 (= topk-l2 keep=0.5) | 180.0 | 1.80x |" in r.to_markdown()
    rows = {row["label"]: row for row in csv.DictReader(io.StringIO(r.to_csv()))}
    assert rows["topk-l2 keep=0.51"]["same_as"] == "topk-l2 keep=0.5" and rows["none"]["same_as"] == ""
    assert SweepResult.from_dict(json.loads(json.dumps(r.to_dict()))).points == r.points
    old = r.to_dict()
    for p in old["points"]:
        del p["same_as"]
    assert [p.same_as for p in SweepResult.from_dict(old).points] == [None] * len(r.points)
    with Image.open(io.BytesIO(plot_png(r))) as im:
        im.load()
