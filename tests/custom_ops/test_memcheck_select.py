"""The RaggedSelect calls of memcheck_ort_fuzz.py (tests/support/memcheck_select.py, torch-free): the script without a
CUDA EP runs them on the CPU EP (equal to the numpy oracle, every invalid input refused, exit 0); the oracle's
checks bite; its cu clamping is the kernels'."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from raggedvit.runtime import create_session, session_options
from tests.support.env import child_env
from tests.support.memcheck_select import SelectCalls, select_rows_numpy

_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="the CPU-only path")
def test_script_runs_select_calls_on_cpu(ort_library):
    proc = subprocess.run(
        [sys.executable, "-m", "tests.custom_ops.memcheck_ort_fuzz", "--calls", "500", "--seed", "3"],
        capture_output=True, text=True, timeout=300, cwd=_ROOT, env=child_env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "only the RaggedSelect calls run" in proc.stdout
    counts = re.search(r"memcheck fuzz: 100 CPU-EP calls \{(.*)\}, 0 unexpected errors", proc.stdout)
    assert counts, proc.stdout[-2000:]
    for kind in ("valid", "clamped", "bad_attr", "bad_shape"):
        assert f"'select_{kind}'" in counts.group(1)


def test_oracle_catches_a_wrong_output(ort_library, monkeypatch):
    """The calls compare every output: an oracle with one pos off fails the valid calls that have rows."""
    import tests.support.memcheck_select as mod

    def off_by_one(scores, cu, attrs):
        outs, margin, read = select_rows_numpy(scores, cu, attrs)
        outs[3] = outs[3] + 1
        return outs, margin, read

    monkeypatch.setattr(mod, "select_rows_numpy", off_by_one)
    calls = SelectCalls(np.random.default_rng(1), ("cpu",), lambda m, ep: create_session(
        m, ep, options=session_options(log_severity=4)))  # fmt: skip
    results = [calls.call() for _ in range(60)]
    assert any(kind == "valid" and failure and "pos differs" in failure for kind, failure in results)


def test_oracle_clamps_cu_like_the_kernels():
    """cu = [5, 2, 9] with T = 6: image 0 reads nothing (hi clamped up to lo = 5), image 1 rows [2, 6) clamped to
    width 3: kept rows (slots 0 and 2 of image 1) first, then the other slots in slot order."""
    attrs = {"width": 3, "bound": 3, "num_prefix": 1, "policy": 0, "keep": 0.5, "mass": 0.0}
    scores = np.array([9, 9, 0.0, 1.0, 2.0, 9], np.float32)
    (src, cu_new, seq_id, pos, k), _, read = select_rows_numpy(scores, np.array([5, 2, 9]), attrs)
    assert k.tolist() == [-1, 1] and cu_new.tolist() == [0, 0, 2]
    assert src.tolist() == [2, 4, 0, 0, 0, 3] and seq_id.tolist() == [1, 1, 0, 0, 0, 1]
    assert pos.tolist() == [0, 1, 0, 0, 0, 0]
    assert read.tolist() == [False, False, False, True, True, False]
