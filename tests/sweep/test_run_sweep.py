"""run_sweep on the CPU: a small deit_tiny (seeded, 2 blocks, 64 px) over topk-l2, cls-mass and tome on the sample
photos in ImageNet-style class folders; an interrupted run resumed; the refusals that come before any export."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from PIL import Image

import raggedvit.sweep.runner as runner
from raggedvit.images import sample_images
from raggedvit.sweep import FILES, SweepInputError, SweepResult, grid_points, run_sweep
from raggedvit.weights import load_vit

TINY = {"img_size": 64, "model_kwargs": {"depth": 2}}
# the sample photos in class folders: synsets of ImageNet-1k (timm's label set of deit) and one class index
CLASSES = {"chelsea": "n02123045", "coffee": "n07920052", "rocket": "n04266014", "astronaut": "7"}


def _points():
    return [
        *grid_points("topk-l2", "keep=0.3,0.5,0.7 at=1"),
        *grid_points("cls-mass", "mass=0.8,0.95 at=1"),
        *grid_points("tome", "r=2,4"),  # every block
    ]


def _class_folders(root: Path) -> Path:
    for name, image in sample_images():
        if name in CLASSES:
            (root / CLASSES[name]).mkdir(parents=True, exist_ok=True)
            image.resize((96, 72)).save(root / CLASSES[name] / f"{name}.png")
    return root


class _Interrupt:
    """measure_speed that raises KeyboardInterrupt on call number `at` (1-based; 0: never) and counts its calls."""

    def __init__(self, at: int) -> None:
        self.at, self.calls = at, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.at:
            raise KeyboardInterrupt
        return _REAL_SPEED(*args, **kwargs)


_REAL_SPEED = runner.measure_speed


@pytest.mark.slow
def test_sweep_writes_four_files_and_resumes_after_an_interrupt(tmp_path: Path, monkeypatch) -> None:
    vit, info = load_vit("deit_tiny_patch16_224", seed=0, **TINY)
    folder, out = _class_folders(tmp_path / "imagenet"), tmp_path / "out"
    kwargs = {"images": folder, "batch": 3, "seconds": 0.02, "out": out}
    first = _Interrupt(at=4)  # none and two topk-l2 points finish; the third is in progress
    monkeypatch.setattr(runner, "measure_speed", first)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(vit, info, _points(), **kwargs)
    partial = json.loads((out / "sweep.json").read_text())
    assert [p["label"] for p in partial["points"]] == ["none", "topk-l2 keep=0.3 at=1", "topk-l2 keep=0.5 at=1"]
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES)  # the export's staging folder is gone

    again = _Interrupt(at=0)
    monkeypatch.setattr(runner, "measure_speed", again)
    result = run_sweep(vit, info, _points(), resume=True, **kwargs)
    assert again.calls == 5  # only the five unfinished points
    assert [p.label for p in result.points] == ["none", *(f"topk-l2 keep={k} at=1" for k in (0.3, 0.5, 0.7)),
                                                *(f"cls-mass mass={m} at=1" for m in (0.8, 0.95)),
                                                "tome r=2", "tome r=4"]  # fmt: skip
    data = json.loads((out / "sweep.json").read_text())
    for old, new in zip(partial["points"], data["points"]):  # the finished points were not measured again
        assert {k: v for k, v in old.items() if k not in ("speedup", "pareto")} == {
            k: v for k, v in new.items() if k not in ("speedup", "pareto")
        }

    # accuracy columns from the class folders; the unpruned baseline agrees with itself
    base = result.baseline
    assert result.metric == "top1" and base is not None and base.agreement == 1.0 and base.kl == 0.0
    assert base.tokens == [] and base.flops_ratio == 1.0
    for p in result.points:
        assert 0.0 <= p.top1 <= p.top5 <= 1.0 and 0.0 <= p.agreement <= 1.0 and p.kl >= 0.0
        assert p.img_per_s > 0 and p.gpu_ms is None and not p.cuda_graph
    tome2, tome4 = result.points[-2:]  # 17 rows, 2 then 4 merged in each of the 2 blocks
    assert tome2.tokens == [15.0, 13.0] and tome4.tokens == [13.0, 9.0] and tome4.flops_ratio < tome2.flops_ratio < 1
    keep3 = result.points[1]
    assert keep3.tokens == [1 + 5] and keep3.flops_ratio < 1.0  # ceil(0.3 * 16) patches + the class token
    rows = list(csv.DictReader(io.StringIO((out / "sweep.csv").read_text())))
    assert len(rows) == 8 and {"top1", "top5", "agreement", "kl", "img_per_s", "flops_ratio"} <= set(rows[0])
    assert [r["label"] for r in rows] == [p.label for p in result.by_speed()]  # fastest first
    md = (out / "sweep.md").read_text()
    assert "| top-1 | top-5 |" in md and md.count("●") == len(result.pareto()) + 1  # + the legend's
    with Image.open(out / "sweep.png") as im:
        im.load()
        assert im.format == "PNG"

    nothing = _Interrupt(at=0)  # everything finished: a resume measures nothing
    monkeypatch.setattr(runner, "measure_speed", nothing)
    assert run_sweep(vit, info, _points(), resume=True, **kwargs).points == result.points and nothing.calls == 0


@pytest.fixture(scope="module")
def tiny():
    return load_vit("deit_tiny_patch16_224", seed=0, **TINY)


def test_refusals_before_any_export(tiny, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(runner, "measure_speed", _Interrupt(at=1))  # an export would fail the test
    vit, info = tiny
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [
        ({"images": empty}, "no images"),
        ({"labels": tmp_path / "labels.txt"}, "--labels needs --images DIR with class folders"),
        ({"batch": 10**9}, "--batch 1000000000 does not fit the cpu"),
        ({"batch": 0}, "--batch must be positive"),
        ({"dtype": "int8"}, "--dtype must be one of fp32, fp16, fp16-all"),
        ({"resume": True}, "--resume needs the folder"),
    ]
    for kwargs, message in cases:
        with pytest.raises(SweepInputError) as e:
            run_sweep(vit, info, [], **kwargs)
        assert message in str(e.value), (kwargs, str(e.value))
    with pytest.raises(SweepInputError, match="prune index 7 out of range 1..1"):
        run_sweep(vit, info, grid_points("topk-l2", "at=7"))
    headless, hinfo = load_vit("deit_tiny_patch16_224", seed=0, model_kwargs={"depth": 2, "num_classes": 0})
    with pytest.raises(SweepInputError, match="no classifier head"):
        run_sweep(headless, hinfo, [])


def test_resume_refuses_other_settings(tiny, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(runner, "measure_speed", _Interrupt(at=1))
    vit, info = tiny
    out = tmp_path / "out"
    out.mkdir()
    other = SweepResult({"batch": 999})
    (out / "sweep.json").write_text(json.dumps(other.to_dict()))
    with pytest.raises(SweepInputError, match=r"other settings \(batch: 999, now 2\)"):
        run_sweep(vit, info, [], batch=2, out=out, resume=True)
    (out / "sweep.json").write_text("{")
    with pytest.raises(SweepInputError, match="--resume: cannot read"):
        run_sweep(vit, info, [], batch=2, out=out, resume=True)
