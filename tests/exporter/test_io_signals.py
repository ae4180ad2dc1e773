"""SIGTERM the moment a writer's temp entry appears (inotify; _signal_harness.py), 20 times per target: exit 130
(or 0 when the write finished first), no temp entry left, and the output complete or absent (a report is both
files or neither). Targets: export (save_model), triton-repo, validate --report, bench --json."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HARNESS = Path(__file__).with_name("_signal_harness.py")
ATTEMPTS = 20
COMPLETE = {
    "export": [["m.onnx"]],
    "triton-repo": [["m", "m/1", "m/1/model.onnx", "m/config.pbtxt", "m/libraggedvit_ort.so"]],
    "report": [["rep.json", "rep.md"]],
    "bench-json": [["b.json"]],
}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify and fork")
@pytest.mark.parametrize("target", sorted(COMPLETE))
def test_a_signal_at_the_temp_entry_leaves_nothing_behind(tmp_path, target):
    out = subprocess.run(
        [sys.executable, str(HARNESS), target, str(ATTEMPTS), str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(rows) == ATTEMPTS and all(r["killed"] for r in rows), out.stdout
    for r in rows:
        assert not [p for p in r["listing"] if Path(p).name.startswith(".")], r  # no temp entry
        assert r["listing"] in ([], *COMPLETE[target]), r  # all of the output or none of it
        assert r["code"] in (0, 130) and (r["listing"] or r["code"] == 130), r
    assert sum(r["code"] == 130 and not r["listing"] for r in rows) >= 2, rows  # some signals caught it mid-write
