"""A seeded CPU-EP fuzz of com.raggedvit::RaggedViTBlock (random shapes, dtypes, attributes, absent optional
inputs; 60% of the calls broken one way: attributes, shapes, element types, cu_seqlens values, required inputs,
num_heads, int64-overflowing sizes), in a child process so that a crash fails the test instead of killing it: no
crash, every broken call refused with an ORT error, every valid one equal to the float64 vit_block_reference."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from _block_cases import BREAKAGES, draw_case

CALLS = 300
SEED = int(os.environ.get("RAGGEDVIT_BLOCK_FUZZ_SEED", "34"))
HERE = Path(__file__).resolve().parent


def test_block_fuzz_cpu(ort_library):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, str(HERE / "_block_cases.py"), str(SEED), "0", str(CALLS), ort_library],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, f"the fuzz child died (rc {proc.returncode}): {proc.stderr[-2000:]}"
    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sum(counts.values()) == CALLS
    failures = {k: v for k, v in counts.items() if k.startswith("FAIL")}
    assert not failures, failures
    assert counts["checked"] > CALLS // 4 and counts["refused"] > CALLS // 4, counts


def test_cases_cover_every_breakage():
    cases = [draw_case(SEED, i) for i in range(CALLS)]
    kinds = Counter(c.breakage.split(":")[0] for c in cases)
    assert all(kinds[k] >= 10 for k in BREAKAGES if k != "missing"), kinds
    assert {c.stream for c in cases} == {"float", "float16"} and {c.gemm for c in cases} == {"float", "float16"}
    assert any(len(c.present) < 16 for c in cases if not c.breakage)  # absent optional inputs on the valid path
