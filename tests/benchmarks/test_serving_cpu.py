"""`python3 -m benchmarks.serving` on CPU (--device cpu --smoke, deit_tiny depth 2): every CPU code path end to end
and the result file's shape; the CUDA-only variants (torch.compile mode="reduce-overhead") skipped with the reason.
Plus the report functions on hand-made records (ratios, bars, the weight-bandwidth floor) and the export pool."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.serving.names import BARS, BASELINE, CUDA_ONLY, PRUNED, UNPRUNED, table_bandwidth
from benchmarks.serving.report import apply_floor, ratios, table, targets

ROOT = Path(__file__).resolve().parents[2]
POLICY = "topk-l2:keep=0.5:at=1"


# one pytest-xdist worker runs this module (`--dist loadgroup`), so its module fixtures run once
pytestmark = pytest.mark.xdist_group("test_serving_cpu")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path_factory.mktemp("serving")
    cmd = [sys.executable, "-m", "benchmarks.serving", "--device", "cpu", "--smoke", "--depth", "2"]
    cmd += ["--batches", "1,4", "--export-workers", "0", "--policies", POLICY, "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (path,) = out.glob("serving_cpu.json")
    assert list(out.glob("serving_cpu.png"))
    return proc, json.loads(path.read_text())


def test_cpu_run_records_every_variant_and_batch(smoke) -> None:
    proc, res = smoke
    assert res["benchmark"] == "benchmarks.serving" and res["config"]["batches"] == [1, 4]
    assert {"env", "bandwidth", "models", "records", "ratios", "targets", "seconds"} <= set(res)
    recs = {(r["variant"], r["policy"], r["batch"]): r for r in res["records"]}
    want = {(v, "none", b) for v in UNPRUNED for b in (1, 4)} | {(v, POLICY, b) for v in PRUNED for b in (1, 4)}
    assert set(recs) == want and len(res["records"]) == len(want)
    for (variant, policy, batch), r in recs.items():
        assert r["model"] == "deit_tiny"
        if variant in CUDA_ONLY:
            assert r["status"] == "skipped" and "CUDA" in r["note"], r
            continue
        assert r["status"] == "ok", r
        assert r["ms_per_batch"] > 0 and r["img_per_s"] > 0 and len(r["round_ms"]) == 1
        assert r["mode"] == ("eager" if variant.endswith("_eager") else "node_by_node")
        assert r["ref"] == ("timm fp32" if policy == "none" else "PrunedViT fp32")
        assert r["top1_agree"] == 1.0 and r["max_abs_logit_diff"] < 1e-3  # fp32 on CPU: the reference's own math
        if policy != "none":  # one stage: fewer than deit_tiny's 197 tokens, the reference's tokens
            assert r["tokens_equal"] == 1.0 and len(r["mean_tokens"]) == 1 and r["mean_tokens"][0] < 197
        assert r["kernels_per_forward"] is None  # no CUDA profile on CPU
        assert r["vs_compile_unpruned"] is None  # the baseline is CUDA-only
        if batch == 1:
            assert r["floor"]["weight_bytes_fp16"] == res["models"]["deit_tiny"]["weight_bytes_fp16"]
    info = res["models"]["deit_tiny"]
    assert set(info["exports"]) == {"none", POLICY}
    assert all("path" in e and e["nodes"] > 0 and e["static_shapes"] for e in info["exports"].values())
    assert res["bandwidth"]["table_source"] and res["bandwidth"]["measured_bytes_per_s"] is None
    rows = res["targets"]  # the topk-l2 bars at the batches run (1 and 4), unmet: no baseline on CPU
    assert {(t["policy"], t["batch"]) for t in rows} == {(POLICY, 1), (POLICY, 4)}
    assert all(not t["met"] and "not measured" in t["why_not"] for t in rows)
    assert "bars: 0/2 met" in proc.stdout


def _rec(variant: str, policy: str, batch: int, img_per_s: float, mode: str = "cuda_graph") -> dict:
    return {"model": "m", "variant": variant, "policy": policy, "batch": batch, "status": "ok", "mode": mode,
            "img_per_s": img_per_s, "ms_per_batch": batch / img_per_s * 1e3}  # fmt: skip


def test_ratios_and_bars_from_records() -> None:
    topk, cls = "topk-l2:keep=0.5:at=4", "cls-mass:mass=0.9:at=3,6,9"
    records = []
    for b in (1, 4, 32, 128):
        records.append(_rec(BASELINE, "none", b, 100.0, mode="cuda_graph_trees"))
        records.append(_rec("ort_raggedvit", topk, b, 210.0 if b == 1 else 150.0))
        records.append(_rec("ort_raggedvit", cls, b, 300.0, mode="node_by_node" if b == 4 else "cuda_graph"))
    records.append({**_rec("ort_raggedvit", topk, 4, 1.0), "status": "error"})
    records = [r for r in records if not (r["policy"] == topk and r["batch"] == 4 and r["status"] == "ok")]
    out = ratios(records)
    assert {r["variant"] for r in out} == {"ort_raggedvit"}  # the baseline is not compared with itself
    by = {(r["policy"], r["batch"]): r["ratio"] for r in out}
    assert by[(topk, 1)] == 2.1 and by[(topk, 4)] is None and by[(cls, 32)] == 3.0
    rows = {(t["policy"], t["batch"]): t for t in targets(records)}
    assert len(rows) == sum(len(b.batches) for b in BARS)
    assert rows[(topk, 1)]["met"] and rows[(topk, 1)]["ratio"] == 2.1
    assert not rows[(topk, 4)]["met"] and "not measured" in rows[(topk, 4)]["why_not"]
    assert not rows[(topk, 32)]["met"] and rows[(topk, 32)]["ratio"] == 1.5  # below 1.6
    assert not rows[(cls, 4)]["met"] and "node_by_node" in rows[(cls, 4)]["why_not"]  # 3x, but not a CUDA graph
    assert rows[(cls, 1)]["met"] and rows[(cls, 128)]["met"]
    assert rows[(topk, 1)]["gpu_time_ratio"] is None  # no profiles in these records


def test_bars_carry_the_gpu_time_ratio() -> None:
    topk = "topk-l2:keep=0.5:at=4"
    base = {**_rec(BASELINE, "none", 1, 1000.0, mode="cuda_graph_trees"), "gpu_us_per_image": 600.0}
    mine = {**_rec("ort_raggedvit", topk, 1, 1500.0), "gpu_us_per_image": 400.0}
    row = next(t for t in targets([base, mine]) if t["policy"] == topk and t["batch"] == 1)
    assert row["ratio"] == 1.5 and row["gpu_time_ratio"] == 1.5 and not row["met"]  # judged on img/s: 1.5 < 2.0
    mine["gpu_us_per_image"] = 250.0
    row = next(t for t in targets([base, mine]) if t["policy"] == topk and t["batch"] == 1)
    assert row["gpu_time_ratio"] == 2.4 and not row["met"]  # the GPU-time ratio is for reference only


def test_bars_carry_the_ratio_of_every_round() -> None:
    """Rounds pair the baseline's and the variant's runs: the per-round ratios show a bar that only holds because
    of the baseline's slow rounds; they are for reference (the bar judges the medians)."""
    topk = "topk-l2:keep=0.5:at=4"
    base = {**_rec(BASELINE, "none", 32, 1000.0, mode="cuda_graph_trees"), "round_ms": [32.0, 32.0, 40.0]}
    mine = {**_rec("ort_raggedvit", topk, 32, 1700.0), "round_ms": [20.0, 19.0, 20.0]}
    row = next(t for t in targets([base, mine]) if t["policy"] == topk and t["batch"] == 32)
    assert row["round_ratios"] == [1.6, 1.684, 2.0] and row["met_every_round"] and row["met"]
    mine["round_ms"] = [21.0, 19.0, 20.0]  # 32 / 21 < 1.6 in the first round
    row = next(t for t in targets([base, mine]) if t["policy"] == topk and t["batch"] == 32)
    assert row["met_every_round"] is False and row["met"]
    mine["round_ms"] = [20.0, 19.0]  # a round missing: no per-round ratios
    row = next(t for t in targets([base, mine]) if t["policy"] == topk and t["batch"] == 32)
    assert row["round_ratios"] is None and row["met_every_round"] is None
    assert "(rounds" not in table([base, mine], [row])


def test_weight_bandwidth_floor() -> None:
    assert table_bandwidth("NVIDIA H200") == 4.8e12 and table_bandwidth("NVIDIA H100 PCIe") == 2.0e12
    assert table_bandwidth("some GPU") is None and table_bandwidth(None) is None
    records = [_rec("timm_eager", "none", 1, 1000.0), _rec("timm_eager", "none", 4, 1000.0)]
    apply_floor(records, {"m": 4_800_000}, {"table_bytes_per_s": 4.8e12, "measured_bytes_per_s": 2.4e12})
    floor = records[0]["floor"]  # 4.8 MB at 4.8 TB/s: 1 us; 1 ms per image is 1000x that
    assert floor["table_floor_ms"] == pytest.approx(1e-3) and floor["latency_over_table_floor"] == 1000.0
    assert floor["latency_over_measured_floor"] == 500.0
    assert "floor" not in records[1]  # batch 1 only


def test_export_pool_reports_failures() -> None:
    from benchmarks.serving.exports import ExportJob, Exports

    job = ExportJob("no_such_model_patch16_224", "none", "fp32", "/nonexistent/x.onnx")
    pool = Exports([job], workers=1)
    try:
        res = pool.result(job)
    finally:
        pool.close()
    assert "path" not in res and "no_such_model" in res["error"], res


def test_linear_policy_suffix() -> None:
    from benchmarks.serving.names import split_linear

    assert split_linear("cls-mass:mass=0.9:at=3,6,9:linear") == ("cls-mass:mass=0.9:at=3,6,9", True)
    assert split_linear("topk-l2:keep=0.5:at=4") == ("topk-l2:keep=0.5:at=4", False)
    assert split_linear("linear") == ("linear", False)
