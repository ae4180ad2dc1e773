"""The CUDA-EP fuzz drivers on a GPU (`pytest -m gpu`): fuzz_ort_cuda.py (RaggedAttention against the float64
reference, invalid cu_seqlens and position inputs) and the torch-free memcheck_ort_fuzz.py (every com.raggedvit CUDA
kernel) at their full call counts, and both again with fewer calls under `compute-sanitizer --tool memcheck`, which
must report 0 errors.

compute-sanitizer is found on PATH, as $COMPUTE_SANITIZER, or under /usr/local/cuda*/bin; the memcheck tests skip
without it. Each driver runs as a child process from the checkout's root (`python3 -m tests.custom_ops.<driver>`).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

import onnxruntime as ort
import pytest
import torch

from tests.support.env import child_env

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(), reason="needs onnxruntime-gpu"),
]

_ROOT = Path(__file__).resolve().parents[2]
# instrument only the op library's kernels (cuBLAS and torch kernels run uninstrumented: memcheck over every
# kernel of the process is far slower); a kernel whose name contains any of these substrings is checked
_KERNELS = ("_ragged", "_select_", "_bias_gelu", "_gather_layer_norm", "_patch_embed")


def _sanitizer() -> str | None:
    found = os.environ.get("COMPUTE_SANITIZER") or shutil.which("compute-sanitizer")
    return found or next(iter(sorted(glob.glob("/usr/local/cuda*/bin/compute-sanitizer"))), None)


def _run(args: list[str], timeout: float, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=_ROOT, env=child_env(**env), capture_output=True, text=True, timeout=timeout)


def _memcheck(driver: list[str], log: Path, timeout: float, **env: str) -> None:
    san = _sanitizer()
    if san is None:
        pytest.skip("compute-sanitizer not found (set COMPUTE_SANITIZER=/path/to/compute-sanitizer)")
    filters = [a for k in _KERNELS for a in ("--kernel-name", f"kns={k}")]
    cmd = [san, "--tool", "memcheck", "--leak-check", "no", "--error-exitcode", "99", *filters,
           "--log-file", str(log), sys.executable, "-m", *driver]  # fmt: skip
    res = _run(cmd, timeout, **env)
    text = log.read_text() if log.exists() else ""
    summary = [line for line in text.splitlines() if "ERROR SUMMARY" in line]
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:] + text[-3000:]
    assert summary and "ERROR SUMMARY: 0 errors" in summary[-1], text[-3000:]


# The full call counts run without the sanitizer; under it (about 20x slower per call) a share of them, so that the
# suite fits its window (benchmarks.gpu_tests): every kernel, dtype and input kind is still drawn, fewer times.
FULL = {"--calls": 1000, "--linear-calls": 300, "--gelu-calls": 1000, "--norm-calls": 1000, "--embed-calls": 1000}
UNDER_MEMCHECK = {"--calls": 150, "--linear-calls": 60, "--gelu-calls": 150, "--norm-calls": 150, "--embed-calls": 100}


def _counts(counts: dict[str, int]) -> list[str]:
    return [str(x) for kv in counts.items() for x in kv]


def test_cuda_fuzz(tmp_path):
    res = _run([sys.executable, "-m", "tests.custom_ops.fuzz_ort_cuda", "--calls", "1000", "--out", str(tmp_path)],
               timeout=900)  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]


@pytest.mark.parametrize("kernel,seed", [(k, s) for k in FULL for s in (0, 1)])
def test_torch_free_fuzz(kernel: str, seed: int):
    """One kernel family per test (the others at 0 calls), its full count in two halves of different seeds, so that
    pytest-xdist spreads them (the embedding's 1,000 calls took 180 s in one process on an H100)."""
    counts = {k: (n // 2 if k == kernel else 0) for k, n in FULL.items()}
    cmd = [sys.executable, "-m", "tests.custom_ops.memcheck_ort_fuzz", *_counts(counts), "--seed", str(seed)]
    res = _run(cmd, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]


def test_attention_fuzz_under_memcheck(tmp_path):
    # exact-size torch allocations, so out-of-bounds accesses to qkv / cu / out / cls_attn are caught
    calls = str(UNDER_MEMCHECK["--calls"])
    driver = ["tests.custom_ops.fuzz_ort_cuda", "--calls", calls, "--max-t", "400", "--out", str(tmp_path)]
    _memcheck(driver, tmp_path / "memcheck.log", timeout=900, PYTORCH_NO_CUDA_MEMORY_CACHING="1")


def test_torch_free_fuzz_under_memcheck(tmp_path):
    driver = ["tests.custom_ops.memcheck_ort_fuzz", *_counts(UNDER_MEMCHECK)]
    _memcheck(driver, tmp_path / "memcheck.log", timeout=900)
