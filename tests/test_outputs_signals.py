"""SIGTERM the moment a writer's temp entry appears (inotify; _signal_harness.py), 20 times per target: exit 130
(or 0 when the write finished first), no temp entry left, and the output complete or absent (a report is both
files or neither). Targets: export (save_model), triton-repo, validate --report, bench --json. Then SIGTERM the
moment an output is renamed into place, while the command still runs: exit 0 with the output complete, or 130
with nothing left (undo_on_interrupt), never 130 beside a complete file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HARNESS = Path(__file__).with_name("_signal_harness.py")
ATTEMPTS = 40  # signals aimed at the temp entry: with 20, fewer than 2 sometimes landed mid-write under load
COMPLETE = {
    "export": [["m.onnx"]],
    "triton-repo": [["m", "m/1", "m/1/model.onnx", "m/config.pbtxt", "m/libraggedvit_ort.so"]],
    "report": [["rep.json", "rep.md"]],
    "bench-json": [["b.json"]],
}


def _harness(target: str, attempts: int, tmp_path: Path, at: str) -> list[dict]:
    out = subprocess.run(
        [sys.executable, str(HARNESS), target, str(attempts), str(tmp_path), at],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(rows) == attempts and all(r["killed"] for r in rows), out.stdout
    for r in rows:
        assert not [p for p in r["listing"] if Path(p).name.startswith(".")], r  # no temp entry
        assert r["listing"] in ([], *COMPLETE[target]), r  # all of the output or none of it
        assert r["code"] in (0, 130) and (r["listing"] or r["code"] == 130), r
    return rows


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify and fork")
@pytest.mark.parametrize("target", sorted(COMPLETE))
def test_a_signal_at_the_temp_entry_leaves_nothing_behind(tmp_path, target):
    rows = _harness(target, ATTEMPTS, tmp_path, "temp")
    assert sum(r["code"] == 130 and not r["listing"] for r in rows) >= 2, rows  # some signals caught it mid-write


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify and fork")
@pytest.mark.parametrize("target", ["export", "report"])
def test_a_signal_after_the_rename_exits_0_or_leaves_nothing(tmp_path, target):
    rows = _harness(target, 8, tmp_path, "rename")
    assert all((r["code"] == 0) == bool(r["listing"]) for r in rows), rows  # 130 only with nothing left
    assert sum(r["code"] == 130 for r in rows) >= 4, rows  # the signal landed after the rename, the file went
