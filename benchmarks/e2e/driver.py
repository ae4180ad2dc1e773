"""End-to-end throughput of token-pruned ViTs: raggedvit (torch and ONNX Runtime) vs unpruned and padded peers.

Same GPU, same images (raggedvit.images.sample_inputs, as `raggedvit bench`, tiled to the batch), same batch
sizes, data on the device. Variants: timm_eager_fp16, ort_fp16, ort_fp16_optimized (unpruned); per pruning policy
torch_padded_sdpa, torch_varlen, torch_raggedvit, ort_raggedvit. img/s = B / median latency
(raggedvit.timing.measure: synchronized runs after warm-up).

    python3 -m benchmarks.e2e                    # full run (~7 min on an H200), --time-budget 400
    python3 -m benchmarks.e2e --quick            # deit_small 224, batches 1 and 32
    python3 -m benchmarks.e2e --device cpu       # debug run of every code path on CPU (deit_tiny, fp32)

Each model x size runs in its own worker process (a crash or a poisoned CUDA context loses one case only);
every failure becomes a record with its error text. Writes <out>/e2e_<gpu>.json (overwritten in place) after every
case, then the .png, and prints a compact table last. Markdown for the README: python3 -m benchmarks.readme_table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

_T0 = time.time()  # the time budget counts from here, heavy imports (torch, timm, onnxruntime) included

ROOT = Path(__file__).resolve().parents[2]

from benchmarks.e2e.cases import (  # noqa: E402
    BASELINES,
    PRUNED,
    VARIANTS,
    BenchConfig,
    blank_record,
    parse_policy,
    resolve_case,
)
from benchmarks.e2e.report import compact_table, plot, profile_lines, speedups, write_json  # noqa: E402
from benchmarks.env import result_path  # noqa: E402

_REPORT_RESERVE_S = 8.0  # kept back from the budget for the JSON, PNG and table
_HANG_GRACE_S = 10.0  # a worker still running this long after the deadline is killed


def _csv(text: str, cast=str) -> tuple:
    return tuple(cast(p.strip()) for p in text.split(",") if p.strip())


def build_config(args: argparse.Namespace) -> BenchConfig:
    cfg = BenchConfig(time_budget_s=args.time_budget)
    if args.device == "cpu":
        cfg.device, cfg.dtype = "cpu", "fp32"
        cfg.models, cfg.sizes, cfg.batches = ("deit_tiny",), (224,), (1, 2)
        cfg.target_s, cfg.warmup_s = 0.05, 0.02
        cfg.profile_case, cfg.profile_batches = ("deit_tiny", 224), (1, 2)
    if args.quick:
        cfg.models, cfg.sizes = cfg.models[:1] if args.device == "cpu" else ("deit_small",), (224,)
        cfg.batches = (1, 2) if args.device == "cpu" else (1, 32)
        cfg.target_s, cfg.warmup_s = min(cfg.target_s, 0.15), min(cfg.warmup_s, 0.1)
        cfg.profile_case = (cfg.models[0], 224)
    if args.models:
        cfg.models = _csv(args.models)
    if args.sizes:
        cfg.sizes = _csv(args.sizes, int)
    if args.batches:
        cfg.batches = _csv(args.batches, int)
    if args.policies:
        cfg.policies = tuple(args.policies)
    if args.variants:
        bad = [v for v in _csv(args.variants) if v not in VARIANTS]
        if bad:
            sys.exit(f"unknown variants {bad}; choose from {', '.join(VARIANTS)}")
        cfg.variants = _csv(args.variants)
    if args.target_s is not None:
        cfg.target_s = args.target_s
    if args.smoke:
        cfg.target_s, cfg.warmup_s, cfg.min_warmup, cfg.min_runs = 0.0, 0.0, 1, 1
        cfg.profile_batches = cfg.profile_batches[:1]
    if args.depth is not None:
        cfg.model_kwargs = {"depth": args.depth}
    if args.export_dtype:
        cfg.export_dtype = args.export_dtype
    for text in cfg.policies:
        try:
            parse_policy(text)
        except ValueError as exc:
            sys.exit(f"bad --policies entry {text!r}: {exc}")
    if cfg.profile_case is not None and tuple(cfg.profile_case) not in {(m, s) for m in cfg.models for s in cfg.sizes}:
        cfg.profile_case = (cfg.models[-1], cfg.sizes[0])  # deit_base 224 when present, else a case that runs
    return cfg


def environment(device: str) -> dict[str, Any]:
    """GPU name and driver (nvidia-smi, so the parent never initializes CUDA) and library versions."""
    env: dict[str, Any] = {"python": platform.python_version(), "device": device}
    try:
        out = (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
                check=True,
            )
            .stdout.strip()
            .splitlines()[0]
        )
        env["gpu"], env["driver"] = (s.strip() for s in out.split(",", 1))
    except Exception:  # noqa: BLE001 - no GPU / no nvidia-smi
        env["gpu"], env["driver"] = ("cpu" if device == "cpu" else "unknown"), None
    for mod in ("torch", "triton", "onnxruntime", "onnx", "timm", "numpy"):
        try:
            env[mod] = __import__(mod).__version__
        except Exception as exc:  # noqa: BLE001
            env[mod] = f"unavailable ({type(exc).__name__})"
    try:
        env["raggedvit_commit"] = (
            os.environ.get("RAGGEDVIT_COMMIT")  # the caller's commit: the device copy of the tree has a stale .git
            or subprocess.run(
                ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or None
        )
    except Exception:  # noqa: BLE001
        env["raggedvit_commit"] = None
    return env


def expected(cfg: BenchConfig, model: str, size: int) -> list[tuple[str, str, int]]:
    """(policy, variant, batch) a case should record."""
    keys = [("none", v, b) for v in BASELINES if v in cfg.variants for b in cfg.batches]
    keys += [(p, v, b) for p in cfg.policies for v in PRUNED if v in cfg.variants for b in cfg.batches]
    return keys


# ---------------------------------------------------------------- worker (one case)
def run_case(cfg: BenchConfig, model: str, size: int, deadline: float, part: Path | None, sink: dict) -> None:
    """Run one model x size; records go to sink (and to `part` as JSON after every group)."""
    from benchmarks.e2e.runner import CaseRunner, log

    def flush() -> None:
        if part is not None:
            write_json(part, sink)

    try:
        case = resolve_case(model, size)
    except Exception as exc:  # noqa: BLE001
        for pol, v, b in expected(cfg, model, size):
            sink["records"].append(_missing(model, size, pol, v, b, f"bad case: {exc}"))
        flush()
        return
    if cfg.device == "cuda":
        import torch

        sink["gpu"] = torch.cuda.get_device_name()
    log(f"case {case.key} ({case.timm_name}, img_size={size}) starts, {deadline - time.time():.0f} s left")
    runner = CaseRunner(
        case,
        cfg,
        deadline=deadline,
        emit=sink["records"].append,
        flush=flush,
        profiles=sink["profiles"],
        exports=sink["exports"],
    )
    runner.run()
    sink["done"] = True
    flush()


def _missing(model: str, size: int, policy: str, variant: str, batch: int, why: str) -> dict[str, Any]:
    rec = blank_record(model, size, policy, variant, batch, "error")
    rec["error"] = why
    return rec


def _worker_main(args: argparse.Namespace) -> None:
    cfg = BenchConfig.from_dict(json.loads(Path(args.worker_config).read_text()))
    model, size = args.worker_case.split(":")
    sink: dict[str, Any] = {"records": [], "profiles": [], "exports": [], "done": False}
    run_case(cfg, model, int(size), args.deadline, Path(args.worker_out), sink)


# ---------------------------------------------------------------- parent
def _spawn(cfg: BenchConfig, model: str, size: int, deadline: float, parts: Path) -> dict[str, Any]:
    """Run one case in a worker process; returns its part (plus error records if it died)."""
    conf, part = parts / "config.json", parts / f"{model}_{size}.json"
    conf.write_text(json.dumps(cfg.to_dict()))
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.e2e",
        "--worker-config",
        str(conf),
        "--worker-case",
        f"{model}:{size}",
        "--worker-out",
        str(part),
        "--deadline",
        str(deadline),
    ]
    rc: int | str
    try:
        rc = subprocess.run(cmd, timeout=max(deadline - time.time(), 1.0) + _HANG_GRACE_S).returncode
    except subprocess.TimeoutExpired:
        rc = "timeout (killed)"
    sink = {"records": [], "profiles": [], "exports": [], "done": False}
    if part.exists():
        try:
            sink = json.loads(part.read_text())
        except json.JSONDecodeError:
            pass
    if rc != 0 or not sink.get("done"):
        have = {(r["policy"], r["variant"], r["batch"]) for r in sink["records"]}
        why = f"worker for {model} {size} exited with rc={rc} before this ran (see the log above)"
        sink["records"] += [_missing(model, size, *k, why) for k in expected(cfg, model, size) if k not in have]
    return sink


def main() -> None:
    ap = argparse.ArgumentParser(
        prog="python3 -m benchmarks.e2e", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", default="benchmarks/results", help="output directory (default: benchmarks/results)")
    ap.add_argument("--models", help="comma-separated short names (default: deit_small,deit_base)")
    ap.add_argument("--sizes", help="comma-separated image sizes (default: 224,384)")
    ap.add_argument("--batches", help="comma-separated batch sizes (default: 1,4,32,128)")
    ap.add_argument(
        "--policies", nargs="+", help="policy strings (default: topk-l2:keep=0.5:at=4 cls-mass:mass=0.9:at=3,6,9)"
    )
    ap.add_argument("--variants", help=f"comma-separated subset of {','.join(VARIANTS)}")
    ap.add_argument(
        "--export-dtype",
        choices=("fp32", "fp16", "fp16-all"),
        help="raggedvit export recipe (default: the torch dtype)",
    )
    ap.add_argument("--quick", action="store_true", help="deit_small 224 only, batches 1 and 32, shorter timings")
    ap.add_argument("--time-budget", type=float, default=400.0, help="seconds before remaining cases are skipped (400)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: debug run (deit_tiny, fp32)")
    ap.add_argument("--target-s", type=float, help="seconds of timed runs per measurement (0.3; cpu 0.05)")
    ap.add_argument("--depth", type=int, help="debug: cut every model to this many blocks")
    ap.add_argument("--smoke", action="store_true", help="debug: 1 warm-up + 1 timed run (timings meaningless)")
    ap.add_argument("--no-isolate", action="store_true", help="run every case in this process (no worker processes)")
    ap.add_argument("--worker-config", help=argparse.SUPPRESS)
    ap.add_argument("--worker-case", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker_case:
        _worker_main(args)
        return

    t_start = _T0
    cfg = build_config(args)
    deadline = t_start + cfg.time_budget_s - _REPORT_RESERVE_S
    env = environment(cfg.device)
    out_dir = Path(args.out)
    json_path, png_path = result_path(out_dir, "e2e", env["gpu"]), result_path(out_dir, "e2e", env["gpu"], ".png")
    parts = out_dir / f"{json_path.stem}_parts"
    parts.mkdir(parents=True, exist_ok=True)
    print(f"[e2e] {env}\n[e2e] config {cfg.to_dict()}", flush=True)
    results: dict[str, Any] = {
        **env,
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "config": cfg.to_dict(),
        "inputs": "raggedvit.images.sample_inputs(): the sample photos preprocessed per model, tiled to the batch, "
        "already on the device "
        "(float32 for ORT models, the torch dtype for torch variants)",
        "timing": "median of N synchronized host-timed runs after >= 3 warm-up runs; N adapts to ~target_s",
        "records": [],
        "profiles": [],
        "onnx_baselines": [],
        "speedups": [],
        "seconds": None,
    }
    write_json(json_path, results)
    for size in cfg.sizes:  # every model at 224 first: the main setting survives a short budget
        for model in cfg.models:
            if deadline - time.time() < 15.0:
                why = "time budget exhausted before this case started"
                sink = {"records": [], "profiles": [], "exports": []}
                sink["records"] += [
                    {**_missing(model, size, *k, why), "status": "skipped"} for k in expected(cfg, model, size)
                ]
            elif args.no_isolate:
                sink = {"records": [], "profiles": [], "exports": [], "done": False}
                try:
                    run_case(cfg, model, size, deadline, None, sink)
                except Exception as exc:  # noqa: BLE001 - one case never aborts the run
                    have = {(r["policy"], r["variant"], r["batch"]) for r in sink["records"]}
                    why = f"case crashed: {type(exc).__name__}: {exc}"[:600]
                    todo = [k for k in expected(cfg, model, size) if k not in have]
                    sink["records"] += [_missing(model, size, *k, why) for k in todo]
            else:
                sink = _spawn(cfg, model, size, deadline, parts)
            results["records"] += sink["records"]
            results["profiles"] += sink["profiles"]
            results["onnx_baselines"] += sink["exports"]
            if sink.get("gpu") and results.get("gpu") in (None, "unknown"):
                results["gpu"] = sink["gpu"]
            results["speedups"] = speedups(results["records"], list(cfg.policies))
            results["seconds"] = round(time.time() - t_start, 1)
            write_json(json_path, results)
    try:
        plot(results["records"], png_path, f"benchmarks.e2e on {results['gpu']} ({cfg.dtype})")
    except Exception as exc:  # noqa: BLE001
        print(f"[e2e] plot failed: {exc!r}", flush=True)
    results["seconds"] = round(time.time() - t_start, 1)
    write_json(json_path, results)
    shutil.rmtree(parts, ignore_errors=True)  # the workers' partial files: all of them are in json_path now
    for line in profile_lines(results["profiles"]):
        print(f"[e2e] {line}", flush=True)
    print(f"[e2e] wrote {json_path} and {png_path.name} in {results['seconds']} s", flush=True)
    print(compact_table(results["records"], list(cfg.policies), results["speedups"]), flush=True)


if __name__ == "__main__":
    main()
