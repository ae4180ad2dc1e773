"""Serving speed: every way to serve a ViT on one GPU, in one run, on the same images and batch sizes.

Per model (deit_base, deit_small at 224 px; seeded weights, raggedvit.weights) and batch (1, 4, 32, 128):
  timm_eager         timm's model, eager, fp16
  timm_compile       torch.compile(mode="reduce-overhead") of timm's model, fp16 (the ratios' denominator)
  ort_unpruned       raggedvit's policy-none export (fp16-all) in ONNX Runtime as a CUDA graph (GraphRunner)
and per pruning policy (topk-l2 keep 0.5 at block 4; cls-mass mass 0.9 at blocks 3, 6, 9):
  prunedvit_eager    raggedvit.pruning.PrunedViT, eager, fp16
  prunedvit_compile  torch.compile(mode="reduce-overhead") of PrunedViT (failures and fallbacks recorded)
  ort_raggedvit      raggedvit's export (fp16-all): a CUDA graph when its shapes are static, else node by node
A policy string ending in ":linear" (cls-mass:mass=0.9:at=3,6,9:linear) runs those three with the block GEMMs in
raggedvit's ragged linear op (PrunedViT(ragged_linear=True), export --ragged-linear); ":dead-linear" only in the
blocks whose rows include dead rows (ragged_linear="dead-rows", export --ragged-linear-blocks dead-rows).

Images: raggedvit.images.sample_inputs (the sample photos) tiled to the batch, on the device. img/s = B / the
median over rounds of each round's median latency (raggedvit.timing.measure); rounds interleave the variants.
Each record also holds kernels and GPU time per forward (torch.profiler/CUPTI), the logits against float32
references (timm for unpruned, PrunedViT for pruned variants), at batch 1 the latency over the weight-bandwidth
floor, and the ratio to timm_compile; `targets` evaluates the speed bars (benchmarks.serving.names.BARS).

    python3 -m benchmarks.serving                         # H200: both models, ~4 min
    python3 -m benchmarks.serving --tome --out DIR        # tome r = 8, 16 against topk-l2 at the same final count
    python3 -m benchmarks.serving --device cpu --smoke    # debug: deit_tiny, fp32, CUDA-only variants skipped

Writes <out>/serving_<gpu>.json (serving_tome_<gpu>.json with --tome, its token-merging bars judged at the end by
benchmarks.tome_targets) after every model (overwritten in place), then the .png, and prints the table last.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

_T0 = time.time()  # the time budget counts from here, imports included

from benchmarks.e2e.report import write_json  # noqa: E402
from benchmarks.env import result_path  # noqa: E402
from benchmarks.serving.config import ServingConfig  # noqa: E402
from benchmarks.serving.names import BANDWIDTH_SOURCE, VARIANTS, table_bandwidth, timm_name  # noqa: E402
from benchmarks.serving.report import apply_floor, plot, ratios, table, targets  # noqa: E402

__all__ = ["build_config", "main", "measure_copy_bandwidth"]

_REPORT_RESERVE_S = 6.0


def _csv(text: str, cast=str) -> tuple:
    return tuple(cast(p.strip()) for p in text.split(",") if p.strip())


def build_config(args: argparse.Namespace) -> ServingConfig:
    cfg = ServingConfig(time_budget_s=args.time_budget)
    if args.device == "cpu":
        cfg.device, cfg.dtype, cfg.export_dtype = "cpu", "fp32", "fp32"
        cfg.models, cfg.batches, cfg.export_workers = ("deit_tiny",), (1, 2), 1
    for name, cast in (("models", str), ("batches", int)):
        if getattr(args, name):
            setattr(cfg, name, _csv(getattr(args, name), cast))
    if args.tome:
        from benchmarks.serving.names import TOME_POLICIES

        cfg.policies = TOME_POLICIES
    if args.policies:
        cfg.policies = tuple(args.policies)
    if args.variants:
        bad = [v for v in _csv(args.variants) if v not in VARIANTS]
        if bad:
            raise SystemExit(f"unknown variants {bad}; choose from {', '.join(VARIANTS)}")
        cfg.variants = _csv(args.variants)
    for name in ("rounds", "seconds", "export_workers", "export_dtype", "top_kernels"):
        if getattr(args, name) is not None:
            setattr(cfg, name, getattr(args, name))
    cfg.compile_dynamic = {"auto": None, "true": True, "false": False}[args.compile_dynamic]
    cfg.cupti_warmup = args.cupti_warmup
    if args.smoke:
        cfg.rounds, cfg.seconds, cfg.min_runs, cfg.profile_forwards = 1, 0.0, 1, 1
    if args.depth is not None:
        cfg.model_kwargs = {"depth": args.depth}
    from benchmarks.e2e.cases import parse_policy
    from benchmarks.serving.names import split_linear

    for text in cfg.policies:
        try:
            parse_policy(split_linear(text)[0])
        except ValueError as exc:
            raise SystemExit(f"bad --policies entry {text!r}: {exc}") from None
    return cfg


def measure_copy_bandwidth(nbytes: int = 1 << 30, reps: int = 10) -> dict[str, Any]:
    """Device-to-device copy bandwidth: `reps` copies of `nbytes` (each reads and writes nbytes), CUDA events."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1e3
    del src, dst
    torch.cuda.empty_cache()
    return {"bytes_per_s": 2 * nbytes * reps / seconds, "copy_bytes": nbytes, "reps": reps}


def _bandwidth(env: dict[str, Any], device: str) -> dict[str, Any]:
    gpu = (env.get("gpu") or {}).get("name")
    out: dict[str, Any] = {
        "gpu": gpu,
        "table_bytes_per_s": table_bandwidth(gpu),
        "table_source": BANDWIDTH_SOURCE,
        "measured_bytes_per_s": None,
        "measured": "device-to-device copy of 1 GiB (read + write bytes / time, CUDA events), this run",
    }
    if device == "cuda":
        try:
            m = measure_copy_bandwidth()
            out["measured_bytes_per_s"] = round(m["bytes_per_s"], -6)
        except Exception as exc:  # noqa: BLE001
            out["measured_error"] = f"{type(exc).__name__}: {exc}"[:300]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python3 -m benchmarks.serving", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="output folder (benchmarks/results)")
    ap.add_argument("--models", help="comma-separated short (<name>_patch16_224) or timm names (deit_base,deit_small)")
    ap.add_argument("--batches", help="comma-separated batch sizes (1,4,32,128)")
    ap.add_argument(
        "--policies", nargs="+", help="policy strings (topk-l2:keep=0.5:at=4 cls-mass:mass=0.9:at=3,6,9 tome:r=8)"
    )
    ap.add_argument(
        "--tome",
        action="store_true",
        help="policies tome r=8 and r=16 (every block) and topk-l2 at block 4 keeping the same final token count",
    )
    ap.add_argument("--variants", help=f"comma-separated subset of {','.join(VARIANTS)}")
    ap.add_argument("--export-dtype", choices=("fp32", "fp16", "fp16-all"), help="export recipe (fp16-all; cpu fp32)")
    ap.add_argument("--rounds", type=int, help="interleaved timing rounds per batch (3)")
    ap.add_argument("--seconds", type=float, help="timed seconds per variant per round (0.12)")
    ap.add_argument("--export-workers", type=int, help="export processes (6; cpu 1; 0 = in this process)")
    ap.add_argument("--top-kernels", type=int, help="kernels by GPU time kept per record (8)")
    ap.add_argument(
        "--compile-dynamic",
        choices=("auto", "true", "false"),
        default="auto",
        help="torch.compile(dynamic=...): auto = dynamo's default (one recompile with a dynamic batch); "
        "false = one compile per batch size (default: auto)",
    )
    ap.add_argument("--cupti-warmup", action="store_true", help="empty profiler session before any CUDA graph")
    ap.add_argument("--time-budget", type=float, default=230.0, help="seconds before the rest is skipped (230)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: debug run (deit_tiny, fp32)")
    ap.add_argument("--depth", type=int, help="debug: cut every model to this many blocks")
    ap.add_argument("--smoke", action="store_true", help="debug: one round, minimal runs (timings meaningless)")
    ap.add_argument("--work", type=Path, help="folder for the exports (default: a temporary folder)")
    args = ap.parse_args(argv)
    cfg = build_config(args)

    from benchmarks.env import environment
    from benchmarks.serving.exports import ExportJob, Exports
    from benchmarks.serving.runner import ModelRun, blank_record, log

    deadline = _T0 + cfg.time_budget_s - _REPORT_RESERVE_S
    work = args.work or Path(tempfile.mkdtemp(prefix="serving_"))
    work.mkdir(parents=True, exist_ok=True)
    jobs = {
        m: {
            p: ExportJob(
                timm_name(m),
                p,
                cfg.export_dtype,
                str(work / f"{m}_{i}_{p.split(':')[0]}.onnx"),
                tuple(sorted(cfg.model_kwargs.items())),
            )
            for i, p in enumerate(("none", *cfg.policies))
        }
        for m in cfg.models
    }
    exports = Exports([j for js in jobs.values() for j in js.values()], cfg.export_workers)
    env = environment()
    if cfg.device == "cuda" and cfg.cupti_warmup:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]):
            pass
    gpu = (env.get("gpu") or {}).get("name") or ("cpu" if cfg.device == "cpu" else "unknown")
    name = "serving_tome" if args.tome else "serving"  # the tome run is its own benchmark: its own canonical file
    json_path, png_path = result_path(args.out, name, gpu), result_path(args.out, name, gpu, ".png")
    result: dict[str, Any] = {
        "benchmark": "benchmarks.serving",
        "env": env,
        "config": cfg.to_dict(),
        "inputs": "raggedvit.images.sample_inputs(): the sample photos, timm eval transform, tiled to the batch, on "
        "the device (float32 for ONNX Runtime, the torch dtype for torch variants)",
        "timing": "per round: median of synchronized host-timed runs (raggedvit.timing.measure, ~seconds each); "
        "ms_per_batch = median over rounds; rounds interleave the variants, order reversed every other round",
        "kernels": "torch.profiler CUDA activity (CUPTI) over profile_forwards timed calls: kernels_per_forward "
        "excludes memcpy/memset (copies_per_forward); gpu_us_per_image = summed kernel time / batch",
        "bandwidth": _bandwidth(env, cfg.device),
        "models": {},
        "records": [],
        "ratios": [],
        "targets": [],
        "seconds": None,
    }
    write_json(json_path, result)
    log(f"config {cfg.to_dict()}; exports in {work}")
    try:
        for model in cfg.models:
            info: dict[str, Any] = {}
            result["models"][model] = info
            emit = result["records"].append
            runner = ModelRun(cfg, model, jobs[model], exports, deadline=deadline, emit=emit, info=info)
            if deadline - time.time() < 30.0:
                runner.skip_all("time budget exhausted before this model started")
            else:
                have = len(result["records"])
                try:
                    runner.run()
                except Exception as exc:  # noqa: BLE001 - one model never aborts the run
                    traceback.print_exc()
                    done = {(r["variant"], r["policy"], r["batch"]) for r in result["records"][have:]}
                    why = f"model run crashed: {type(exc).__name__}: {exc}"[:600]
                    for v, p in runner.keys():
                        for b in cfg.batches:
                            if (v, p, b) not in done:
                                emit(blank_record(model, v, p, b, "error", error=why))
            _summarize(result)
            result["seconds"] = round(time.time() - _T0, 1)
            write_json(json_path, result)
    finally:
        exports.close()
    try:
        plot(result["records"], png_path, f"benchmarks.serving on {gpu} ({cfg.dtype}; exports {cfg.export_dtype})")
    except Exception as exc:  # noqa: BLE001
        log(f"plot failed: {exc!r}")
    if args.tome:
        from benchmarks.tome_targets import evaluate

        try:
            result["tome_targets"] = evaluate(result)
        except Exception as exc:  # noqa: BLE001 - the records stay; `python3 -m benchmarks.tome_targets` redoes it
            log(f"tome_targets failed: {exc!r}")
    result["seconds"] = round(time.time() - _T0, 1)
    write_json(json_path, result)
    log(f"wrote {json_path} in {result['seconds']} s")
    print(table(result["records"], result["targets"]), flush=True)
    return 0


def _summarize(result: dict[str, Any]) -> None:
    weights = {m: i["weight_bytes_fp16"] for m, i in result["models"].items() if "weight_bytes_fp16" in i}
    apply_floor(result["records"], weights, result["bandwidth"])
    result["ratios"] = ratios(result["records"])
    result["targets"] = targets(result["records"])
