"""`python3 -m benchmarks.e2e` end to end on CPU (--device cpu --smoke): every code path but the CUDA-only ones,
through the worker process, then benchmarks.readme_table on its JSON; and the up-front / time-budget failure paths."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.e2e.names import BASELINES, CUDA_ONLY, PRUNED

ROOT = Path(__file__).resolve().parents[2]
BENCH = ("-m", "benchmarks.e2e")
POLICIES = ["topk-l2:keep=0.5:at=1", "cls-mass:mass=0.9:at=1,2"]


def _run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def _results(out: Path) -> dict:
    (path,) = out.glob("e2e_cpu.json")
    return json.loads(path.read_text())


# one pytest-xdist worker runs this module (`--dist loadgroup`), so its module fixtures run once
pytestmark = pytest.mark.xdist_group("test_bench_e2e_cpu")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path_factory.mktemp("e2e")
    proc = _run(
        "-m", "benchmarks.e2e", "--device", "cpu", "--depth", "3", "--smoke", "--out", str(out), "--policies", *POLICIES
    )
    return proc, out


def test_cpu_run_records_every_variant(smoke) -> None:
    proc, out = smoke
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = _results(out)
    assert res["device"] == "cpu" and res["config"]["batches"] == [1, 2]
    recs = {(r["policy"], r["variant"], r["batch"]): r for r in res["records"]}
    assert len(recs) == len(res["records"]) == len(BASELINES) * 2 + 2 * len(PRUNED) * 2
    for (policy, variant, _batch), r in recs.items():
        if variant in CUDA_ONLY:  # flash varlen attention, CUDA-graph replay: skipped with the reason
            assert r["status"] == "skipped" and "CUDA" in r["note"], r
            continue
        assert r["status"] == "ok", r
        assert r["latency_ms"] > 0 and r["img_per_s"] > 0 and r["runs"] >= 1
        if policy == "none":
            assert r["mean_tokens"] is None
        else:  # pruning happened: fewer than the 197 tokens of deit_tiny 224, one mean per stage
            n_stages = 1 if policy.startswith("topk") else 2
            assert len(r["mean_tokens"]) == n_stages and all(t < 197 for t in r["mean_tokens"])
            assert r["top1_ref"] == "torch_raggedvit" and r["top1_agree"] == 1.0
    topk = POLICIES[0]
    assert recs[(topk, "ort_raggedvit", 2)]["mean_tokens"] == recs[(topk, "torch_raggedvit", 2)]["mean_tokens"]
    assert "CPUExecutionProvider" in recs[("none", "ort_fp16", 1)]["note"]
    assert recs[("none", "ort_fp16_optimized", 1)]["top1_ref"] == "timm_eager_fp16"
    (opt,) = res["onnx_baselines"]
    assert opt["attention_nodes"] >= 1  # ORT's optimizer fused the split-qkv attention
    assert {(s["batch"], s["policy"]) for s in res["speedups"]} == {(b, p) for b in (1, 2) for p in POLICIES}
    assert all(s["speedup_vs_best_unpruned"] and s["speedup_vs_padded"] for s in res["speedups"])
    assert all(s["ours_variant"] == "ort_raggedvit" for s in res["speedups"])  # no CUDA graphs on the CPU
    (prof,) = res["profiles"]  # --smoke profiles the first profile batch only
    assert prof["batch"] == 1 and "error" not in prof
    assert "RaggedAttention" in {op["op_type"] for op in prof["ort"]["ops"]}
    assert prof["ort"]["sections_us_per_run"]["attention"] > 0
    assert list(out.glob("e2e_cpu.png"))
    last = proc.stdout.strip().splitlines()
    assert any(line.startswith("model ") and "ort_rv" in line for line in last[-8:])  # the table is printed last


def test_readme_table_of_the_run(smoke) -> None:
    _, out = smoke
    (path,) = out.glob("e2e_cpu.json")
    proc = _run("-m", "benchmarks.readme_table", str(path), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "**deit_tiny 224px**" in proc.stdout
    assert "| raggedvit ORT / best unpruned (eager, ort, ort opt) | topk-l2:keep=0.5:at=1 |" in proc.stdout
    bad = _run("-m", "benchmarks.readme_table", str(out / "missing.json"), timeout=120)
    assert bad.returncode != 0 and "cannot read" in bad.stderr


def test_bad_policy_fails_before_any_work(tmp_path) -> None:
    proc = _run(
        "-m", "benchmarks.e2e", "--device", "cpu", "--out", str(tmp_path), "--policies", "topk-l2:ratio=2", timeout=120
    )
    assert proc.returncode != 0 and "bad --policies entry 'topk-l2:ratio=2'" in proc.stderr
    assert not list(tmp_path.glob("*.json"))


def test_exhausted_budget_records_skips(tmp_path) -> None:
    proc = _run(*BENCH, "--device", "cpu", "--out", str(tmp_path), "--time-budget", "1", timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = _results(tmp_path)
    assert res["records"] and all(r["status"] == "skipped" for r in res["records"])
    assert "time budget" in res["records"][0]["error"]
