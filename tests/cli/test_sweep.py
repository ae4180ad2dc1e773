"""`raggedvit sweep`: its input errors (exit 2, one `error:` line, before any export) and one real run on the CPU.

The sweep itself (the grid, interrupts and --resume, accuracy columns from class folders) is tested through the
library in tests/sweep/; here the command line in front of it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from raggedvit.cli.contract import EXPORT_DTYPES, IGNORED_BY_POLICY
from raggedvit.policies import POLICIES, POLICY_PARAMS
from raggedvit.pruning.precision import DTYPES
from raggedvit.sweep import FILES
from tests.support.cli import run_cli
from tests.support.env import ROOT, child_env

MODEL = "deit_tiny_patch16_224"
TOPK = ("--policy", "topk-l2", "--grid", "keep=0.5 at=4")


def _assert_one_error(res, fragment: str) -> None:
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2, res.stderr
    assert [ln for ln in lines if ln.startswith("error: ")] == [lines[-1]], res.stderr
    assert fragment in lines[-1], res.stderr


def _cases(tmp: Path) -> dict[str, tuple[list[str], str]]:
    empty = tmp / "empty"
    empty.mkdir()
    labels = tmp / "labels.txt"
    labels.write_text("cats\n")
    other = tmp / "other"
    other.mkdir()
    (other / "sweep.json").write_text(json.dumps({"settings": {"batch": 999}, "points": []}))
    return {
        "no policy": ([MODEL], "give at least one --policy with its --grid"),
        "policy without grid": ([MODEL, "--policy", "topk-l2"], "give one --grid per --policy (got 1 --policy"),
        "empty grid": ([MODEL, "--policy", "topk-l2", "--grid", ""], "--grid for topk-l2 is empty"),
        "unknown key": ([MODEL, "--policy", "cls-mass", "--grid", "keep=0.5"], "unknown key 'keep'; cls-mass takes"),
        "bad value": ([MODEL, "--policy", "topk-l2", "--grid", "keep=2"], "keep must be in (0, 1]"),
        "none as policy": ([MODEL, "--policy", "none", "--grid", ""], "'none' is not one of"),
        "folder with no images": ([MODEL, *TOPK, "--images", str(empty)], "no images"),
        "missing folder": ([MODEL, *TOPK, "--images", str(tmp / "nope")], "does not exist"),
        "images is a file": ([MODEL, *TOPK, "--images", str(labels)], "is a file, not a folder"),
        "labels without folder": ([MODEL, *TOPK, "--labels", str(labels)], "--labels needs --images DIR"),
        "batch too big": ([MODEL, *TOPK, "--batch", "1000000000"], "--batch 1000000000 does not fit the cpu"),
        "batch zero": ([MODEL, *TOPK, "--batch", "0"], "--batch must be positive"),
        "two image sources": ([MODEL, *TOPK, "--images", str(empty), "--sample-images"], "at most one of --images"),
        "two weight sources": ([MODEL, *TOPK, "--seed", "0", "--pretrained"], "at most one of --checkpoint"),
        "block out of range": ([MODEL, "--policy", "topk-l2", "--grid", "at=12"], "prune index 12 out of range 1..11"),
        "out is a file": ([MODEL, *TOPK, "--out", str(labels)], "is a file"),
        "resume other settings": ([MODEL, *TOPK, "--out", str(other), "--resume"], "was made with other settings"),
        "out empty": ([MODEL, *TOPK, "--out", ""], "--out is empty (''): name the folder"),
    }


@pytest.mark.parametrize(
    "name",
    [
        "no policy",
        "policy without grid",
        "empty grid",
        "unknown key",
        "bad value",
        "none as policy",
        "folder with no images",
        "missing folder",
        "images is a file",
        "labels without folder",
        "batch too big",
        "batch zero",
        "two image sources",
        "two weight sources",
        "block out of range",
        "out is a file",
        "resume other settings",
        "out empty",
    ],
)
def test_bad_input_is_one_error_line(name: str, tmp_path: Path, monkeypatch) -> None:
    """Exit 2 with one error line; nothing is written or left, in the current folder (--out's default, and where an
    empty --out used to write) or elsewhere."""
    args, fragment = _cases(tmp_path)[name]
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.glob("**/*"))
    res = run_cli("sweep", *args, "--seconds", "0.01")
    _assert_one_error(res, fragment)
    assert sorted(tmp_path.glob("**/*")) == before


def test_cli_tables_come_from_the_policy_definitions() -> None:
    """The options the CLI refuses per policy are the PruneSpec fields the other policies read; the CLI's dtype list
    is the export recipes' (kept torch-free)."""
    assert set(IGNORED_BY_POLICY) == set(POLICIES) == set(POLICY_PARAMS)
    for policy, ignored in IGNORED_BY_POLICY.items():
        assert not set(ignored) & set(POLICY_PARAMS[policy])
    assert IGNORED_BY_POLICY["topk-l2"] == ("mass", "r") and IGNORED_BY_POLICY["cls-mass"] == ("keep", "r")
    assert IGNORED_BY_POLICY["tome"] == ("keep", "mass")  # fuse: PruneSpec's own error
    assert EXPORT_DTYPES == DTYPES


@pytest.mark.slow
def test_cli_sweep_writes_the_table_and_resumes(tmp_path: Path) -> None:
    """deit_tiny at 64 px, one topk-l2 point and the baseline: the four files, the table on stdout; --resume then
    measures nothing and prints the same table."""
    out = tmp_path / "out"
    args = ["sweep", MODEL, "--seed", "0", "--img-size", "64", *TOPK, "--batch", "2", "--seconds", "0.02"]
    res = run_cli(*args, "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES)
    assert "| topk-l2 keep=0.5 at=4 |" in res.stdout and "| none |" in res.stdout
    data = json.loads((out / "sweep.json").read_text())
    assert data["settings"]["dtype"] == "fp32" and data["settings"]["weights"]["source"] == "seeded"
    again = run_cli(*args, "--out", str(out), "--resume")
    assert again.returncode == 0, again.stderr
    assert json.loads((out / "sweep.json").read_text())["points"] == data["points"]
    assert again.stdout == res.stdout


@pytest.mark.slow
def test_ctrl_c_keeps_the_finished_points(tmp_path: Path) -> None:
    """SIGINT to `python -m raggedvit sweep` once two points are written: exit 130, those points stay (nothing else:
    no scratch export), and --resume measures only the rest."""
    out = tmp_path / "out"
    args = [MODEL, "--seed", "0", "--img-size", "64", "--policy", "topk-l2", "--grid", "keep=0.3,0.5,0.7 at=4"]
    args += ["--batch", "2", "--seconds", "0.02", "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "raggedvit", "sweep", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_env(), cwd=ROOT)  # fmt: skip
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if len(_points(out)) >= 2:
                break
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    kept = _points(out)
    assert proc.returncode == 130, stderr
    assert 2 <= len(kept) < 4 and kept[0]["label"] == "none", stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES)
    res = run_cli("sweep", *args, "--resume")
    assert res.returncode == 0, res.stderr
    done = _points(out)
    assert [p["label"] for p in done] == ["none", *(f"topk-l2 keep={k} at=4" for k in (0.3, 0.5, 0.7))]
    assert [p["seconds"] for p in done[: len(kept)]] == [p["seconds"] for p in kept]  # not measured again


def _points(out: Path) -> list[dict]:
    try:
        return json.loads((out / "sweep.json").read_text())["points"]
    except (OSError, ValueError):
        return []


# ---- the hardening rows, end to end: the points' measurements are FakeSpeed's (tests/support/sweep.py) -------------
def test_tome_on_a_family_without_merging_is_refused_like_export(tmp_path: Path) -> None:
    """sweep refuses what export refuses, before any point, with export's line: exit 2, no files."""
    model = ["vit_relpos_small_patch16_224", "--seed", "0", "--img-size", "64"]
    export = run_cli("export", *model, "--policy", "tome", "--r", "8", "-o", str(tmp_path / "m.onnx"))
    sweep = run_cli("sweep", *model, *TOPK[:3], "keep=0.5 at=1", "--policy", "tome", "--grid", "r=8",
                    "--out", str(tmp_path / "out"))  # fmt: skip
    _assert_one_error(export, "--policy tome cannot run vit_relpos_small_patch16_224: its relative position bias")
    _assert_one_error(sweep, "--policy tome cannot run vit_relpos_small_patch16_224: its relative position bias")
    assert sweep.stderr.strip().splitlines()[-1] == export.stderr.strip().splitlines()[-1]
    assert list(tmp_path.iterdir()) == []


def test_progress_lines_and_equal_points(tmp_path: Path, monkeypatch) -> None:
    """Off a terminal: the count of points before the first one, then a line per point with the time left. tome's r
    past half the tokens (64 px: 16 patches, 12 blocks: from r=8 on) is one model: measured once, its equals listed
    as such."""
    import raggedvit.sweep.runner as runner
    from tests.support.sweep import FakeSpeed

    speed = FakeSpeed()
    monkeypatch.setattr(runner, "measure_speed", speed)
    grid = "r=" + ",".join(str(r) for r in range(1, 301))
    res = run_cli("sweep", MODEL, "--seed", "0", "--img-size", "64", "--policy", "tome", "--grid", grid,
                  "--batch", "2", "--out", str(tmp_path / "out"))  # fmt: skip
    assert res.returncode == 0, res.stderr
    lines = res.stderr.splitlines()
    count = "301 points (the unpruned model and the grid's 300): 9 to measure, 292 equal to another point"
    assert lines[0] == f"sweep: {count}, not measured again", lines
    assert lines[1].startswith("sweep: 1/9 none in ") and lines[1].endswith(" left") and " s; about " in lines[1]
    assert lines[9].startswith("sweep: 9/9 tome r=8 in ") and lines[-1].startswith("wrote ")
    assert speed.calls == 9 and "| tome r=300 (= tome r=8) |" in res.stdout
    assert len(json.loads((tmp_path / "out" / "sweep.json").read_text())["points"]) == 301


def _slow_sweep(out: Path, marker: Path, *, slow_point: int) -> subprocess.Popen:
    """`raggedvit sweep` (64 px deit_tiny, topk-l2 keep=0.5 and 0.7) in a process of its own, with FakeSpeed's
    measurements: point `slow_point` spends 120 s in weakref callbacks, `marker` written as it starts."""
    args = [MODEL, "--seed", "0", "--img-size", "64", "--policy", "topk-l2", "--grid", "keep=0.5,0.7 at=4"]
    env = child_env(SLOW_POINT=str(slow_point), MARKER=str(marker))
    command = [sys.executable, "-m", "tests.support.sweep", "sweep", *args, "--batch", "2", "--out", str(out)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def _wait_for(marker: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 240
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), proc.communicate(timeout=10)[1] if proc.poll() is not None else "no slow point in 240 s"


def test_ctrl_c_during_a_point_ends_it_at_once(tmp_path: Path) -> None:
    """SIGINT while a point spends its time in weakref callbacks (as torch's export does): the handler runs in one,
    where Python drops its exception. One error line within a second or two (not when the point ends, 120 s later),
    no "Exception ignored ... Traceback", exit 130, the finished point kept."""
    out, marker = tmp_path / "out", tmp_path / "marker"
    proc = _slow_sweep(out, marker, slow_point=2)
    try:
        _wait_for(marker, proc)
        lines: list[tuple[float, str]] = []
        reader = threading.Thread(target=lambda: lines.extend((time.monotonic(), ln) for ln in proc.stderr))
        reader.start()
        time.sleep(0.5)  # well inside the callbacks
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
        ended = time.monotonic()
        reader.join(timeout=10)
    finally:
        proc.kill()
    errors = [(t, ln) for t, ln in lines if ln.startswith("error: ")]
    text = "".join(ln for _, ln in lines)
    assert code == 130 and len(errors) == 1 and errors[0][1] == lines[-1][1], text
    kept = ", ".join(str(out / f) for f in sorted(FILES))
    assert errors[0][1] == f"error: interrupted by SIGINT; kept {kept} to resume from\n", text
    assert [ln for _, ln in lines if not ln.startswith(("sweep: ", "error: "))] == [], text
    assert errors[0][0] - sent < 1.0 and ended - sent < 3.0, (errors[0][0] - sent, ended - sent)  # with a loaded CPU
    assert [p["label"] for p in _points(out)] == ["none"] and sorted(p.name for p in out.iterdir()) == sorted(FILES)


def test_a_second_sweep_into_one_out_is_refused(tmp_path: Path) -> None:
    """Two sweeps into one --out would each write their own points over the other's: while the first runs, the second
    is refused (exit 2, naming the folder), and writes nothing there."""
    out, marker = tmp_path / "out", tmp_path / "marker"
    proc = _slow_sweep(out, marker, slow_point=2)
    try:
        _wait_for(marker, proc)
        first = (out / "sweep.json").read_text()
        second = run_cli("sweep", MODEL, "--seed", "0", "--img-size", "64", *TOPK, "--out", str(out))
        _assert_one_error(second, f"--out {str(out)!r} is in use by another sweep; wait for it to end")
        assert (out / "sweep.json").read_text() == first
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
    finally:
        proc.kill()
    assert [p["label"] for p in _points(out)] == ["none"]
