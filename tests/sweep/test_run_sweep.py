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
from tests.support.sweep import FakeSpeed

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
    monkeypatch.setattr(runner, "measure_speed", FakeSpeed())
    vit, info = tiny
    out = tmp_path / "out"
    run_sweep(vit, info, [], batch=2, out=out)
    other = SweepResult.load(out / "sweep.json")
    other.settings["batch"] = 999
    (out / "sweep.json").write_text(json.dumps(other.to_dict()))
    with pytest.raises(SweepInputError, match=r"other settings \(batch: 999, now 2\)"):
        run_sweep(vit, info, [], batch=2, out=out, resume=True)
    (out / "sweep.json").write_text("{")
    with pytest.raises(SweepInputError, match="--resume: cannot read"):
        run_sweep(vit, info, [], batch=2, out=out, resume=True)


# ---- the hardening rows: points checked up front, equal points, resume, the --out folder --------------------------
def _refuse_measuring(monkeypatch) -> None:
    def fail(*args, **kwargs):
        raise AssertionError("a measurement started")

    for name in ("reference", "measure_accuracy", "measure_speed"):
        monkeypatch.setattr(runner, name, fail)


@pytest.mark.parametrize("model", ["vit_relpos_small_patch16_224", "cait_xxs24_224", "eva02_tiny_patch14_224"])
def test_tome_on_a_family_without_merging_is_refused_before_any_point(model: str, tmp_path: Path, monkeypatch) -> None:
    """Every point is checked against the model before the first measurement, with export's message; nothing is
    written (the --out folder is not made)."""
    from raggedvit.pruning.families import backbone_for

    _refuse_measuring(monkeypatch)
    vit, info = load_vit(model, seed=0, img_size=56, model_kwargs={"depth": 2, "num_classes": 10})
    points = [*grid_points("topk-l2", "keep=0.5 at=1"), *grid_points("tome", "r=2")]
    with pytest.raises(SweepInputError) as e:
        run_sweep(vit, info, points, out=tmp_path / "out")
    assert str(e.value) == f"--policy tome cannot run {model}: {backbone_for(vit).merge_refusal}"
    assert list(tmp_path.iterdir()) == []


def test_dynamicvit_without_its_predictor_is_refused_before_any_point(tmp_path: Path, monkeypatch) -> None:
    """A learned policy's point whose checkpoint has no predictor: refused before the first measurement, naming the
    missing keys; nothing is written."""
    _refuse_measuring(monkeypatch)
    vit, info = load_vit("deit_tiny_patch16_224", seed=0, img_size=64, model_kwargs={"depth": 4, "num_classes": 10})
    points = [*grid_points("topk-l2", "keep=0.5 at=1"), *grid_points("dynamicvit", "keep=0.7 at=1,2,3")]
    with pytest.raises(SweepInputError) as e:
        run_sweep(vit, info, points, out=tmp_path / "out")
    assert str(e.value).startswith("dynamicvit keep=0.7 at=1,2,3: policy 'dynamicvit' needs its predictor weights")
    assert list(tmp_path.iterdir()) == []


def test_equal_tome_points_are_measured_once(tiny, tmp_path: Path, monkeypatch) -> None:
    """64 px: 16 patch tokens and the class token in 2 blocks. r=8 merges 8 then 4 (half of the patches), as r=9 and
    r=30 do: those two are not measured, their rows are r=8's, labelled as such and off the Pareto front."""
    speed = FakeSpeed()
    monkeypatch.setattr(runner, "measure_speed", speed)
    vit, info = tiny
    result = run_sweep(vit, info, grid_points("tome", "r=2,8,9,30"), batch=3, out=tmp_path / "out")
    assert speed.calls == 3  # none, r=2, r=8
    r8, r9, r30 = result.points[2:]
    assert (r9.same_as, r30.same_as, r8.same_as) == (r8.key, r8.key, None) and r9.seconds == r30.seconds == 0.0
    assert r9.tokens == r8.tokens == [9.0, 5.0] and r9.img_per_s == r8.img_per_s and r9.label == "tome r=9"
    assert r9.key not in result.pareto() and r30.key not in result.pareto()
    md = (tmp_path / "out" / "sweep.md").read_text()
    assert "| tome r=9 (= tome r=8) |" in md and "| tome r=30 (= tome r=8) |" in md
    rows = {r["label"]: r for r in csv.DictReader(io.StringIO((tmp_path / "out" / "sweep.csv").read_text()))}
    assert rows["tome r=30"]["same_as"] == "tome r=8" and rows["tome r=8"]["same_as"] == ""
    assert SweepResult.load(tmp_path / "out" / "sweep.json").points == result.points


def test_resume_with_a_narrower_grid_keeps_the_finished_points(tiny, tmp_path: Path, monkeypatch) -> None:
    """The finished points that the grid no longer lists are measurements of this model and settings: kept, after
    the grid's points; a point equal to a kept one is not measured either."""
    speed = FakeSpeed()
    monkeypatch.setattr(runner, "measure_speed", speed)
    vit, info = tiny
    out = tmp_path / "out"
    first = run_sweep(vit, info, [*grid_points("topk-l2", "keep=0.3,0.5,0.7 at=1"), *grid_points("tome", "r=8")],
                      batch=3, out=out)  # fmt: skip
    assert speed.calls == 5
    narrower = [*grid_points("topk-l2", "keep=0.5 at=1"), *grid_points("tome", "r=30")]
    again = run_sweep(vit, info, narrower, batch=3, out=out, resume=True)
    assert speed.calls == 5  # nothing measured: r=30 merges as r=8 does
    labels = ["none", "topk-l2 keep=0.5 at=1", "tome r=30", "topk-l2 keep=0.3 at=1", "topk-l2 keep=0.7 at=1"]
    assert [p.label for p in again.points] == [*labels, "tome r=8"]
    assert again.points[2].same_as == first.points[-1].key
    assert [p.label for p in SweepResult.load(out / "sweep.json").points] == [p.label for p in again.points]
    assert {p.key: p for p in again.points} | {p.key: p for p in first.points} == {p.key: p for p in again.points}


def test_resume_after_a_change_of_model_names_the_model(tiny, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(runner, "measure_speed", FakeSpeed())
    vit, info = tiny
    out = tmp_path / "out"
    run_sweep(vit, info, [], batch=3, out=out)
    data = json.loads((out / "sweep.json").read_text())
    data["settings"] |= {"model": "deit_small_patch16_224", "depth": 12}  # and the weights' digest, the images...
    (out / "sweep.json").write_text(json.dumps(data))
    with pytest.raises(SweepInputError, match=r"other settings \(model: 'deit_small_patch16_224', now 'deit_tiny"):
        run_sweep(vit, info, [], batch=3, out=out, resume=True)


def test_a_run_that_wrote_nothing_leaves_no_folder(tiny, tmp_path: Path, monkeypatch) -> None:
    """An input error found while measuring (an image that does not decode) or an interrupt before the first point
    leaves nothing the run made: not the --out folder, nor its parents; a folder that was there stays."""
    monkeypatch.setattr(runner, "measure_speed", FakeSpeed())
    vit, info = tiny
    images = tmp_path / "images"
    images.mkdir()
    (images / "a.png").write_bytes(b"not a png")
    with pytest.raises(SweepInputError, match="a.png"):
        run_sweep(vit, info, [], images=images, out=tmp_path / "new" / "out")
    assert not (tmp_path / "new").exists()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "reference", interrupted)
    for out in (tmp_path / "new" / "out", images):
        with pytest.raises(KeyboardInterrupt):
            run_sweep(vit, info, [], batch=3, out=out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images"] and [p.name for p in images.iterdir()] == ["a.png"]


def test_out_must_name_a_folder_and_be_free(tiny, tmp_path: Path, monkeypatch) -> None:
    """out "" (an unset shell variable) is refused, not taken for the current folder; a folder another run holds
    (outputs.held_folder, as a second sweep would find it) is refused, and nothing is written into it."""
    _refuse_measuring(monkeypatch)
    vit, info = tiny
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SweepInputError, match=r"--out is empty \(''\)"):
        run_sweep(vit, info, [], out="")
    from raggedvit.outputs import held_folder

    with held_folder(tmp_path / "out"), pytest.raises(SweepInputError, match="is in use by another sweep"):
        run_sweep(vit, info, [], out=tmp_path / "out")
    assert list(tmp_path.iterdir()) == []
