"""`python3 -m benchmarks.serving` on CPU (--device cpu --smoke, deit_tiny depth 2): every CPU code path end to end
and the result file's shape; the CUDA-only variants (torch.compile mode="reduce-overhead") skipped with the reason; the
block engine variants run eagerly (the block op's CPU kernel is its reference; no CUDA graph on CPU), the block
engine's exports (--engine block) on the CPU EP (RaggedViTBlock's CPU kernel).
Plus the report functions on hand-made records (ratios, bars, the engine's targets, the weight-bandwidth floor), the
engine probe's counting, the export jobs and pool, and how an export variant records what it cannot run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.serving.names import (
    BARS,
    BASELINE,
    CUDA_ONLY,
    ENGINE,
    ENGINE_PAIRS,
    ENGINE_TARGETS,
    ORT,
    ORT_ENGINE,
    PRUNED,
    UNPRUNED,
    table_bandwidth,
)
from benchmarks.serving.report import apply_floor, engine_targets, ratios, table, targets

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
    assert {"env", "bandwidth", "models", "records", "ratios", "targets", "engine_targets", "seconds"} <= set(res)
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
        assert r["mode"] == ("eager" if variant.endswith("_eager") or variant in ENGINE else "node_by_node")
        if variant in ENGINE:  # the reference kernel on CPU: the engine is never asked
            assert r["engine"]["calls"] == 0 and "reference" in r["engine"]["note"], r
        else:
            assert "engine" not in r
        if variant in ORT_ENGINE:  # the --engine block exports: RaggedViTBlock's CPU kernel, said in the note
            assert "CPU EP" in r["note"] and "RaggedViTBlock" in r["note"], r
        elif variant in ORT:
            assert r["note"] == "", r
        assert r["ref"] == ("timm fp32" if policy == "none" else "PrunedViT fp32")
        assert r["top1_agree"] == 1.0 and r["max_abs_logit_diff"] < 1e-3  # fp32 on CPU: the reference's own math
        if policy != "none":  # one stage: fewer than deit_tiny's 197 tokens, the reference's tokens
            assert r["tokens_equal"] == 1.0 and len(r["mean_tokens"]) == 1 and r["mean_tokens"][0] < 197
        assert r["kernels_per_forward"] is None  # no CUDA profile on CPU
        assert r["vs_compile_unpruned"] is None  # the baseline is CUDA-only
        if batch == 1:
            assert r["floor"]["weight_bytes_fp16"] == res["models"]["deit_tiny"]["weight_bytes_fp16"]
        if variant in ENGINE_PAIRS:  # wall time over its unpruned engine's; GPU time unknown without a profile
            assert r["vs_engine_unpruned"]["wall_time"] > 0 and r["vs_engine_unpruned"]["gpu_time"] is None
        else:
            assert "vs_engine_unpruned" not in r
    info = res["models"]["deit_tiny"]
    assert set(info["exports"]) == set(info["engine_exports"]) == {"none", POLICY}
    assert all("path" in e and e["nodes"] > 0 and e["static_shapes"] for e in info["exports"].values())
    assert all("engine" not in e for e in info["exports"].values())
    for e in info["engine_exports"].values():  # one RaggedViTBlock node per block, fewer nodes than the per-op export
        assert e["path"].endswith("_block.onnx") and e["static_shapes"], e
        assert (e["engine"], e["block_nodes"], e["depth"]) == ("block", 2, 2), e
    assert all(info["engine_exports"][p]["nodes"] < info["exports"][p]["nodes"] for p in ("none", POLICY))
    assert res["bandwidth"]["table_source"] and res["bandwidth"]["measured_bytes_per_s"] is None
    rows = res["targets"]  # the topk-l2 bars at the batches run (1 and 4), unmet: no baseline on CPU
    assert {(t["policy"], t["batch"]) for t in rows} == {(POLICY, 1), (POLICY, 4)}
    assert all(not t["met"] and "not measured" in t["why_not"] for t in rows)
    assert "bars: 0/2 met" in proc.stdout
    assert info["engine"] == {"dtype": "fp32", "error": None}
    # deit_tiny: the targets that name no model (pruned over unpruned engine at 1 and 4, wall time at 1 and 4) of
    # the torch engine and of its export, unmet: no GPU profile, no torch.compile baseline on CPU
    erows = res["engine_targets"]
    want = {(e, a, b) for e, u in ENGINE_PAIRS.items() for a in (BASELINE, u) for b in (1, 4)}
    assert len(erows) == 8 and {(t["variant"], t["against"], t["batch"]) for t in erows} == want
    assert all(not t["met"] and t["value"] is None and t["why_not"] for t in erows)
    assert "engine targets: 0/8 met" in proc.stdout


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


def _timed(variant: str, policy: str, batch: int, gpu_us: float | None, ms: float, model: str = "deit_base") -> dict:
    return {**_rec(variant, policy, batch, batch / ms * 1e3), "model": model, "ms_per_batch": ms,
            "gpu_us_per_forward": gpu_us}  # fmt: skip


@pytest.mark.parametrize(("engine", "unpruned"), list(ENGINE_PAIRS.items()))
def test_engine_targets_from_records(engine: str, unpruned: str) -> None:
    """Every target of ENGINE_TARGETS judged from the records, for the torch engine and for its export alike:
    absolute GPU time per model, pruned over unpruned engine (GPU time), wall-time speedup over torch.compile, large
    batches against today's exports. The other pair's targets are unmet (not measured) in these records."""
    topk = "topk-l2:keep=0.5:at=4"
    recs = []
    for model, us in (("deit_base", {1: 140.0, 4: 260.0}), ("deit_small", {1: 90.0, 4: 150.0})):
        for b in (1, 4, 32, 128):
            g = us.get(b, 1000.0 * b / 32)
            recs += [
                _timed(engine, topk, b, g, ms=0.2 if b == 1 else 0.5, model=model),
                _timed(unpruned, "none", b, g / 0.7 if b == 1 else g / 0.8, ms=1.0, model=model),
                _timed(BASELINE, "none", b, 5000.0, ms=0.62 if b == 1 else 1.0, model=model),
                _timed("ort_raggedvit", topk, b, g if b == 32 else g * 0.99, ms=1.0, model=model),
                _timed("ort_unpruned", "none", b, g * 2, ms=1.0, model=model),
            ]
    all_rows = engine_targets(recs)
    rows = {(t["model"], t["target"], t["batch"]): t for t in all_rows if t["variant"] in (engine, unpruned)}
    others = [t for t in all_rows if t["variant"] not in (engine, unpruned)]
    assert others and all(not t["met"] and t["why_not"].startswith("not measured") for t in others)
    texts = {t.text: t for t in ENGINE_TARGETS if t.variant in (engine, unpruned)}
    # one row per target, model it applies to and batch: 3 model-specific rows, 7 per model for the others
    assert len(rows) == 3 + 2 * sum(len(t.batches) for t in texts.values() if t.models is None)
    assert len(all_rows) == len(ENGINE_PAIRS) * len(rows)  # the same targets for every pair

    def row(model: str, variant: str, batch: int, against: str | None = None, metric: str = "gpu_us") -> dict:
        (text,) = [k for k, t in texts.items() if (t.variant, t.against, t.metric) == (variant, against, metric)
                   and batch in t.batches and (t.models is None or model in t.models)]  # fmt: skip
        return rows[(model, text, batch)]

    assert row("deit_base", engine, 1)["met"] and row("deit_base", engine, 1)["value"] == 140.0
    assert not row("deit_base", engine, 4)["met"]  # 260 us > 250 us
    assert not row("deit_small", engine, 1)["met"]  # 90 us > 80 us
    assert not any(m == "deit_small" and "deit_base" in text for m, text, _ in rows)  # deit_base-only targets
    assert row("deit_base", engine, 1, unpruned)["value"] == 0.7
    assert row("deit_base", engine, 1, unpruned)["met"]
    assert not row("deit_base", engine, 4, unpruned)["met"]  # 0.8 > 0.75
    assert row("deit_base", engine, 1, BASELINE, "wall")["value"] == 3.1  # 0.62 ms / 0.2 ms
    assert row("deit_base", engine, 1, BASELINE, "wall")["met"]
    assert not row("deit_base", engine, 4, BASELINE, "wall")["met"]  # 2.0x < 2.5x
    assert row("deit_base", engine, 32, "ort_raggedvit")["met"]  # equal GPU time: not slower
    assert not row("deit_base", engine, 128, "ort_raggedvit")["met"]  # 1% slower than today's export
    assert row("deit_base", unpruned, 32, "ort_unpruned")["policy"] == "none"
    assert row("deit_base", unpruned, 128, "ort_unpruned")["met"]
    # a missing side or a missing profile: unmet with the reason, never a value
    recs = [r for r in recs if not (r["variant"] == unpruned and r["batch"] == 1)]
    recs[0]["gpu_us_per_forward"] = None  # deit_base engine B=1
    rows = {(t["model"], t["target"], t["batch"]): t for t in engine_targets(recs)}
    r = row("deit_base", engine, 1)
    assert not r["met"] and r["value"] is None and "profile missing" in r["why_not"]
    r = row("deit_small", engine, 1, unpruned)
    assert not r["met"] and r["why_not"] == f"not measured ({unpruned})"
    out = table(recs, [], engine_targets(recs))
    assert "engine targets:" in out and f"not measured ({unpruned})" in out


def test_engine_targets_judge_the_export_like_the_torch_engine() -> None:
    """ENGINE_TARGETS holds the torch engine's targets once more for its export: same metrics, limits, batches and
    models, ort_engine against ort_engine_unpruned where engine is against engine_unpruned."""
    swap = {"engine": "ort_engine", "engine_unpruned": "ort_engine_unpruned"}
    torch_targets = [t for t in ENGINE_TARGETS if t.variant in ENGINE]
    ort_targets = [t for t in ENGINE_TARGETS if t.variant in ORT_ENGINE]
    assert len(torch_targets) == len(ort_targets) == len(ENGINE_TARGETS) // 2 > 0
    for t, o in zip(torch_targets, ort_targets, strict=True):
        assert (swap[t.variant], swap.get(t.against, t.against)) == (o.variant, o.against)
        same = ("metric", "limit", "batches", "speedup", "models")
        assert [getattr(t, f) for f in same] == [getattr(o, f) for f in same]
    assert set(ORT_ENGINE) <= set(ORT) and set(ORT_ENGINE) <= set(UNPRUNED) | set(PRUNED)
    assert ENGINE_PAIRS == {"engine": "engine_unpruned", "ort_engine": "ort_engine_unpruned"}


@pytest.mark.parametrize(("engine", "unpruned"), list(ENGINE_PAIRS.items()))
def test_engine_ratio_to_unpruned_engine(engine: str, unpruned: str) -> None:
    topk = "topk-l2:keep=0.5:at=4"
    recs = [_timed(engine, topk, 1, 60.0, ms=0.1), _timed(unpruned, "none", 1, 100.0, ms=0.125)]
    other = next(e for e in ENGINE_PAIRS if e != engine)  # its unpruned variant is not in the records
    recs.append(_timed(other, topk, 1, 60.0, ms=0.1))
    ratios(recs)
    assert recs[0]["vs_engine_unpruned"] == {"gpu_time": 0.6, "wall_time": 0.8}
    assert "vs_engine_unpruned" not in recs[1]
    assert recs[2]["vs_engine_unpruned"] == {"gpu_time": None, "wall_time": None}


def test_engine_probe_counts_declines(monkeypatch) -> None:
    """engine_probe counts the block op's calls of the engine as vit_block_cuda makes them (a TypeError is a
    decline: the op then runs its per-op kernels), and restores the engine afterwards."""
    import torch

    from benchmarks.serving.steps import engine_declined, engine_probe
    from raggedvit.kernels import _block_op, block_engine
    from raggedvit.kernels.reference import BlockWeights

    C, F, T = 8, 16, 3
    g = torch.Generator().manual_seed(0)
    shapes = ((C,), (C,), (3 * C, C), (3 * C,), (C, C), (C,), (C,), (C,), (F, C), (F,), (C, F), (C,))
    w = BlockWeights(*(torch.randn(*shape, generator=g) * 0.1 for shape in shapes))
    x, cu = torch.randn(T, C, generator=g), torch.tensor([0, T])
    answers = iter([TypeError("no tiles for C=8"), None])

    def fake(x, cu_seqlens, w, num_heads, **kw):
        a = next(answers)
        if a is not None:
            raise a
        return torch.zeros_like(x)

    monkeypatch.setattr(block_engine, "vit_block_engine", fake)

    def model(images: torch.Tensor) -> None:
        for _ in range(2):
            _block_op.vit_block_cuda(x, cu, w, 2, eps=1e-6, scale=0.5, return_cls_attn=False)

    probe = engine_probe(model, torch.zeros(1))
    assert (probe["calls"], probe["declined"]) == (2, 1) and "no tiles for C=8" in probe["reason"]
    why, note = engine_declined(probe)  # some blocks in the engine: measured, with a note
    assert why is None and "declined 1 of 2" in note and "per-op kernels" in note
    assert block_engine.vit_block_engine is fake  # restored
    assert engine_declined({"calls": 12, "declined": 0, "reason": None}) == (None, "")
    why, _ = engine_declined({"calls": 12, "declined": 12, "reason": "TypeError: T too large"})
    assert "declined 12 of 12" in why and "T too large" in why  # the variant is skipped with this reason
    assert "never called" in engine_declined({"calls": 0, "declined": 0, "reason": None})[0]


def test_engine_variant_skips_with_the_reason(monkeypatch) -> None:
    """On CUDA the engine variant is skipped, not crashed, when the engine takes no block or the CUDA graph
    capture fails (emulated here: capture on a CPU-only build raises)."""
    import torch

    from benchmarks.serving import runner as runner_mod
    from benchmarks.serving.config import ServingConfig
    from benchmarks.serving.runner import ModelRun

    run = ModelRun(ServingConfig(device="cpu"), "deit_tiny", {}, None, deadline=0.0, emit=print, info={})
    run.cuda, run.engine_error = True, None  # as on a GPU
    key = ("engine", POLICY)
    run.engines = {key: lambda images: None}  # never reaches the engine
    m: dict = {"note": ""}
    assert run._engine_step(key, torch.zeros(1, 3, 8, 8), m) is None
    assert "declined 0 of 0" in m["skip"] and "never called" in m["skip"] and m["engine"]["calls"] == 0
    monkeypatch.setattr(runner_mod, "engine_probe", lambda model, x: {"calls": 2, "declined": 0, "reason": None})
    m = {"note": ""}
    assert run._engine_step(key, torch.zeros(1, 3, 8, 8), m) is None
    assert m["skip"].startswith("CUDA graph capture failed: ") and m["note"] == ""
    run.engine_error = "PrunedViT(engine='block') refused the model: ValueError: no"
    m = {"note": ""}
    assert run._engine_step(key, torch.zeros(1), m) is None and m["skip"] == run.engine_error


def test_export_jobs_follow_the_selected_variants(tmp_path: Path) -> None:
    """Per-op exports for ort_unpruned / ort_raggedvit, --engine block exports for ort_engine_unpruned / ort_engine;
    only for the variants the run selects; the block exports drop a ':linear' suffix, so policies differing only in
    it share one export."""
    from benchmarks.serving.config import ServingConfig
    from benchmarks.serving.driver import export_jobs

    cls = "cls-mass:mass=0.9:at=1"
    cfg = ServingConfig(policies=(POLICY, cls, f"{cls}:linear"), model_kwargs={"depth": 2})
    jobs = export_jobs(cfg, "deit_tiny", tmp_path)
    policies = ("none", POLICY, cls, f"{cls}:linear")
    assert set(jobs) == {(p, e) for p in policies for e in ("ops", "block")}
    for (p, e), job in jobs.items():
        assert job.engine == e and job.timm_name == "deit_tiny_patch16_224" and job.dtype == "fp16-all"
        assert job.model_kwargs == (("depth", 2),) and job.path.endswith("_block.onnx") == (e == "block")
        assert job.policy == (cls if e == "block" and p.startswith("cls") else p)
    assert jobs[(cls, "block")] is jobs[(f"{cls}:linear", "block")]  # one export for both
    assert jobs[(cls, "ops")] != jobs[(f"{cls}:linear", "ops")]
    assert len(set(jobs.values())) == 7 and len({j.path for j in jobs.values()}) == 7
    cfg.variants = ("timm_eager", "ort_engine")
    assert set(export_jobs(cfg, "deit_tiny", tmp_path)) == {(p, "block") for p in policies[1:]}
    cfg.variants = ("ort_engine_unpruned", "ort_raggedvit", "engine")
    assert set(export_jobs(cfg, "deit_tiny", tmp_path)) == {("none", "block")} | {(p, "ops") for p in policies[1:]}


def test_export_variant_records_what_it_cannot_run(monkeypatch) -> None:
    """An export variant records why it does not run: the export's error; a --engine block export without a
    RaggedViTBlock node is skipped with the reason; one with fewer block nodes than blocks runs, with a note."""
    import torch

    from benchmarks.serving import runner as runner_mod
    from benchmarks.serving.config import ServingConfig
    from benchmarks.serving.runner import ModelRun

    answers = {
        ("none", "ops"): {"error": "ValueError: no export", "seconds": 0.1},
        ("none", "block"): {"path": "a.onnx", "static_shapes": True, "engine": "block", "block_nodes": 0, "depth": 2},
        (POLICY, "block"): {"path": "b.onnx", "static_shapes": True, "engine": "block", "block_nodes": 1, "depth": 2},
    }

    class Made:
        def result(self, job):
            return answers[job]

    class FakeOrt:
        def __init__(self, path, device, batch, images32, *, graph, cpu_fallback=True):
            self.path, self.graph, self.cpu_fallback = path, graph, cpu_fallback
            self.mode, self.graph_error = "node_by_node", None

    monkeypatch.setattr(runner_mod, "OrtExport", FakeOrt)
    info = {"exports": {}, "engine_exports": {}}
    run = ModelRun(ServingConfig(device="cpu"), "deit_tiny", {k: k for k in answers}, Made(), deadline=0.0,
                   emit=print, info=info)  # fmt: skip
    x = torch.zeros(1, 3, 8, 8)
    m: dict = {"note": ""}
    assert run._ort_step(("ort_unpruned", "none"), 1, x, m) is None
    assert m["error"] == "export failed: ValueError: no export"
    m = {"note": ""}
    assert run._ort_step(("ort_engine_unpruned", "none"), 1, x, m) is None
    assert "no RaggedViTBlock node (of 2 blocks)" in m["skip"] and "error" not in m
    m = {"note": ""}
    got = run._ort_step(("ort_engine", POLICY), 1, x, m)
    assert got.path == "b.onnx" and not got.cpu_fallback and m["mode"] == "node_by_node"
    assert "1 of 2 blocks are RaggedViTBlock nodes" in m["note"] and "CPU EP" in m["note"]
    assert set(info["exports"]) == {"none"} and set(info["engine_exports"]) == {"none", POLICY}


def test_block_export_never_falls_back_to_the_cpu_ep(monkeypatch) -> None:
    """On CUDA, OrtExport(cpu_fallback=False) (the --engine block variants) builds its node-by-node sessions with
    the CPU EP fallback off; when the CUDA graph and that session both fail it raises with both reasons."""
    import torch

    import raggedvit.runtime as rt
    from benchmarks.serving.steps import OrtExport

    calls = []

    def graph_runner(path, batch):
        raise RuntimeError("CUDA graph refused: nodes on the CPU EP")

    def create_session(path, device, *, batch=None, disable_cpu_fallback=False):
        calls.append((device, batch, disable_cpu_fallback))
        raise RuntimeError("RaggedViTBlock has no CUDA kernel for these types")

    monkeypatch.setattr(rt, "GraphRunner", graph_runner)
    monkeypatch.setattr(rt, "create_session", create_session)
    x = torch.zeros(2, 3, 8, 8)
    with pytest.raises(RuntimeError) as err:
        OrtExport("m.onnx", "cuda", 2, x, graph=True, cpu_fallback=False)
    text = str(err.value)
    assert "CUDA graph failed: RuntimeError: CUDA graph refused" in text and "CPU EP fallback off" in text
    assert "no CUDA kernel for these types" in text and calls == [("cuda", 2, True)]
    with pytest.raises(RuntimeError, match="node-by-node session failed too"):  # per-op exports keep the fallback
        OrtExport("m.onnx", "cuda", 2, x, graph=True)
    assert calls[-1] == ("cuda", 2, False)
    with pytest.raises(RuntimeError, match="^RaggedViTBlock has no CUDA kernel"):  # no graph asked: its own error
        OrtExport("m.onnx", "cpu", 2, x, graph=False, cpu_fallback=False)
    assert calls[-1] == ("cpu", 2, False)  # the CPU EP is the only provider on CPU
