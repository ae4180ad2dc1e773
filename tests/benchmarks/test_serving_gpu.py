"""`python3 -m benchmarks.serving` on the GPU with a small model (deit_tiny, depth 4, batches 1 and 4, --smoke): the
CUDA paths end to end — torch.compile(mode="reduce-overhead") of timm and PrunedViT, the policy-none and topk-l2
exports as CUDA graphs, cls-mass recorded (ok or with its error), kernel counts, the copy bandwidth and the ratios."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

ROOT = Path(__file__).resolve().parents[2]
TOPK, CLS = "topk-l2:keep=0.5:at=2", "cls-mass:mass=0.9:at=1,3"


def _serving(tmp_path: Path, policies: list[str], variants: str | None = None) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.serving", "--models", "deit_tiny", "--depth", "4", "--batches", "1,4"]
    cmd += ["--smoke", "--export-workers", "2", "--time-budget", "400", "--out", str(tmp_path)]
    cmd += ["--work", str(tmp_path / "work"), "--policies", *policies]
    cmd += ["--variants", variants] if variants else []
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    (path,) = tmp_path.glob("serving_*.json")
    return json.loads(path.read_text())


def test_serving_cuda_paths(tmp_path: Path) -> None:
    res = _serving(tmp_path, [TOPK])
    recs = {(r["variant"], r["policy"], r["batch"]): r for r in res["records"]}
    assert len(recs) == len(res["records"]) == 2 * (3 + 3)
    for key in [(v, "none", b) for v in ("timm_eager", "timm_compile", "ort_unpruned") for b in (1, 4)] + [
        (v, TOPK, b) for v in ("prunedvit_eager", "prunedvit_compile", "ort_raggedvit") for b in (1, 4)
    ]:
        r = recs[key]
        assert r["status"] == "ok", r
        assert r["kernels_per_forward"] > 0 and r["gpu_us_per_image"] > 0, r
        assert r["top1_agree"] == 1.0, r  # fp16 against float32 on the sample photos
    assert recs[("timm_compile", "none", 1)]["mode"] == "cuda_graph_trees"
    assert recs[("ort_unpruned", "none", 4)]["mode"] == "cuda_graph", recs[("ort_unpruned", "none", 4)]["note"]
    assert recs[("ort_raggedvit", TOPK, 4)]["mode"] == "cuda_graph"
    assert recs[("ort_raggedvit", TOPK, 1)]["vs_compile_unpruned"] > 0
    assert res["bandwidth"]["measured_bytes_per_s"] > 1e11
    assert recs[("timm_eager", "none", 1)]["floor"]["latency_over_measured_floor"] > 1.0
    assert {t["batch"] for t in res["targets"]} == {1, 4}


def test_serving_cls_mass_records_what_ran(tmp_path: Path) -> None:
    """cls-mass in its own run (the suite spreads the two over workers): whatever ran is recorded, failures with
    their text."""
    res = _serving(tmp_path, [CLS], "prunedvit_compile,ort_raggedvit")
    recs = {(r["variant"], r["policy"], r["batch"]): r for r in res["records"]}
    for b in (1, 4):
        for v in ("prunedvit_compile", "ort_raggedvit"):
            r = recs[(v, CLS, b)]
            assert r["status"] == "ok" or r["error"], r
