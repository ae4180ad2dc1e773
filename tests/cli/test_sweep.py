"""`raggedvit sweep`: its input errors (exit 2, one `error:` line, before any export) and one real run on the CPU.

The sweep itself (the grid, interrupts and --resume, accuracy columns from class folders) is tested through the
library in tests/sweep/; here the command line in front of it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
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
    ],
)
def test_bad_input_is_one_error_line(name: str, tmp_path: Path) -> None:
    args, fragment = _cases(tmp_path)[name]
    res = run_cli("sweep", *args, "--seconds", "0.01")
    _assert_one_error(res, fragment)
    assert not list(tmp_path.glob("**/.sweep*")) and not (tmp_path / "sweep.json").exists()


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
