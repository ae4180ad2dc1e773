"""The command line of benchmarks.serve_load.

Against a running server (its export given for the check):

    python3 -m benchmarks.serve_load --url http://127.0.0.1:8000 --model deit_tiny.onnx --requests 256 --concurrency 8

The canonical run (`--serve`): exports --timm-model (seeded weights, topk-l2 keeping 0.5 at block 4; fp32 on the CPU,
fp16-all on CUDA) unless --model is given, times a direct ORT loop at B = --max-batch-size (raggedvit.timing.measure;
a CUDA graph on CUDA), starts `raggedvit serve` on a free loopback port, sends --warmup requests, then the measured
--requests at --concurrency, checks every answer, stops the server (SIGTERM), times the direct loop again, and writes
benchmarks/results/serve_load_<machine>.json (machine: "cpu", or the GPU's name).

Exit 1 when an answer differs from the direct run or a request got no 200, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.serve_load.client import run_load, summary
from benchmarks.serve_load.reference import check, direct_answers, request_bodies

__all__ = ["direct_loop", "export_model", "main"]

_POLICY = {"policy": "topk-l2", "keep": 0.5, "prune_at": [4]}


def export_model(timm_model: str, dtype: str, folder: Path) -> Path:
    """The benchmark's export of `timm_model` (seed 0, _POLICY) in `folder`."""
    from raggedvit.exporter import export_onnx
    from raggedvit.pruning import PruneSpec
    from raggedvit.weights import load_vit

    vit, info = load_vit(timm_model, seed=0)
    spec = PruneSpec(_POLICY["policy"], tuple(_POLICY["prune_at"]), keep=_POLICY["keep"])
    recipe = {"model": timm_model, "weights": info.to_dict(), "benchmark": "benchmarks.serve_load"}
    return Path(export_onnx(vit, spec, folder / f"{timm_model}.onnx", dtype=dtype, recipe=recipe))


def direct_loop(onnx_path: Path, bodies, batch: int, device: str, target_s: float = 8.0) -> dict[str, float]:
    """img/s of the export in ORT on the bodies' images tiled to `batch` (decoded and preprocessed before timing):
    a session run per batch on the CPU, a GraphRunner replay on CUDA."""
    from raggedvit.exporter.metadata import read_recipe
    from raggedvit.images import decode_image, meta_model, preprocess, tile
    from raggedvit.runtime import GraphRunner, create_session
    from raggedvit.timing import device_sync, measure

    recipe = read_recipe(str(onnx_path))
    model = meta_model(str(recipe["model"]), int(recipe["img_size"]))
    images = tile(preprocess([decode_image(b.data) for b in bodies], model), batch)
    if device == "cuda":
        runner = GraphRunner(onnx_path, batch)
        x = images.cuda()
        timing = measure(lambda: runner(x), device_sync("cuda"), target_s=target_s)
    else:
        session = create_session(onnx_path, "cpu")
        feed = {"images": images.numpy()}
        timing = measure(lambda: session.run(None, feed), device_sync("cpu"), target_s=target_s)
    img_per_s = round(batch / timing.median_ms * 1e3, 2)
    return {"batch": batch, "median_ms": round(timing.median_ms, 2), "img_per_s": img_per_s}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running server (loopback only)")
    ap.add_argument("--model", type=Path, help="the served export (the check's direct run); --serve: serve this one")
    ap.add_argument("--serve", action="store_true", help="the canonical run: export, serve, load, write the result")
    ap.add_argument("--timm-model", default="deit_small_patch16_224")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--max-batch-size", type=int, default=32)
    ap.add_argument("--batch-wait-ms", type=float, default=5.0)
    ap.add_argument("--requests", type=int, default=512)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=64, help="--serve: requests sent before the measured ones")
    ap.add_argument("--images", type=int, default=64, help="distinct images (JPEG, PNG and WebP in turn)")
    ap.add_argument("--timeout-s", type=float, default=120.0, help="the longest wait for one answer")
    ap.add_argument("--max-seconds", type=float, default=900.0, help="no request starts after this")
    ap.add_argument("--json", type=Path, help="--url: write the summary here")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="--serve: the results folder")
    return ap


def _report(label: str, s: dict[str, Any], mismatches: list[str]) -> None:
    lat = s["latency_ms"]
    print(
        f"{label}: {s['ok']}/{s['requests']} answered 200 at concurrency {s['concurrency']}, {s['img_per_s']} img/s, "
        f"latency p50 {lat.get('p50')} p90 {lat.get('p90')} p99 {lat.get('p99')} ms; statuses {s['statuses']}, "
        f"no answer {s['no_answer']}, not sent {s['not_sent']}; batches formed {s['batches_by_size']} "
        f"(mean {s['mean_batch_size']}); {len(mismatches)} answers differ from direct ORT",
        flush=True,
    )
    for line in mismatches[:10]:
        print(f"  {line}")


def _against(args) -> int:
    bodies = request_bodies(args.images)
    reference = direct_answers(args.model, bodies)
    run = run_load(
        args.url,
        bodies,
        requests=args.requests,
        concurrency=args.concurrency,
        timeout_s=args.timeout_s,
        max_seconds=args.max_seconds,
    )
    s, bad = summary(run), check(run.outcomes, reference)
    _report(args.url, s, bad)
    if args.json:
        args.json.write_text(json.dumps({**s, "mismatches": bad}, indent=1) + "\n")
    return 0 if not bad and s["ok"] == s["requests"] else 1


def _canonical(args) -> int:
    import onnxruntime as ort

    from benchmarks.env import environment, result_path
    from benchmarks.serve_load.server import ServerProcess
    from raggedvit.sweep.runner import _device_name

    load_before = [round(x, 2) for x in os.getloadavg()]  # other jobs on the machine: the 1, 5, 15 minute means
    with tempfile.TemporaryDirectory(prefix="serve-load-") as tmp:
        dtype = "fp32" if args.device == "cpu" else "fp16-all"
        model = args.model or export_model(args.timm_model, dtype, Path(tmp))
        bodies = request_bodies(args.images)
        reference = direct_answers(model, bodies)
        before = direct_loop(model, bodies, args.max_batch_size, args.device)
        print(f"direct ORT loop at B={args.max_batch_size}: {before['img_per_s']} img/s", flush=True)
        flags = ["--device", args.device, "--replicas", str(args.replicas)]
        flags += ["--max-batch-size", str(args.max_batch_size), "--batch-wait-ms", str(args.batch_wait_ms)]
        with ServerProcess(model, *flags) as server:
            t0 = time.perf_counter()
            server.wait_ready(timeout_s=600)
            start_s = time.perf_counter() - t0
            load = dict(concurrency=args.concurrency, timeout_s=args.timeout_s, max_seconds=args.max_seconds)
            warm = summary(run_load(server.url, bodies, requests=args.warmup, **load))
            run = run_load(server.url, bodies, requests=args.requests, **load)
            s, bad = summary(run), check(run.outcomes, reference)
            rc = server.stop(signal.SIGTERM)
            left = len(server.running())
        after = direct_loop(model, bodies, args.max_batch_size, args.device)
    load_after = [round(x, 2) for x in os.getloadavg()]
    _report("served", s, bad)
    direct = (before["img_per_s"] + after["img_per_s"]) / 2
    env = environment()
    machine = "cpu" if args.device == "cpu" else (env.get("gpu") or {}).get("name")
    record = {
        "benchmark": "serve_load",
        "command": "python3 -m benchmarks.serve_load --serve " + " ".join(f"{k} {v}" for k, v in _flags(args)),
        "config": {
            "timm_model": args.timm_model if args.model is None else None,
            "model": Path(model).name,
            "dtype": dtype,
            "prune": _POLICY,
            "device": args.device,
            "device_name": _device_name(args.device),
            "replicas": args.replicas,
            "max_batch_size": args.max_batch_size,
            "batch_wait_ms": args.batch_wait_ms,
            "requests": args.requests,
            "concurrency": args.concurrency,
            "warmup": args.warmup,
            "images": args.images,
        },
        "env": {**env, "onnxruntime_providers": ort.get_available_providers()},
        "load_average": {"before": load_before, "after": load_after},
        "server": {**s, "mismatches": bad, "start_s": round(start_s, 1), "exit_code": rc, "left_running": left},
        "warmup": warm,
        "direct_ort": {"before": before, "after": after, "img_per_s": round(direct, 2)},
        "ratio": round(s["img_per_s"] / direct, 3),
        "goal_ratio": 0.7,
    }
    path = result_path(args.out, "serve_load", machine)
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"served / direct ORT at B={args.max_batch_size}: {record['ratio']:.2f} (goal 0.70); wrote {path}")
    return 0 if not bad and s["ok"] == s["requests"] and rc is not None and not left else 1


def _flags(args) -> list[tuple[str, Any]]:
    keys = ("device", "replicas", "max_batch_size", "batch_wait_ms", "requests", "concurrency", "warmup", "images")
    return [(f"--{k.replace('_', '-')}", getattr(args, k)) for k in keys]


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.serve == bool(args.url):
        ap.error("give --url (a running server) or --serve (the canonical run)")
    if args.url and args.model is None:
        ap.error("--url needs --model, the served export (the answers are checked against it)")
    if min(args.requests, args.concurrency, args.max_batch_size, args.images, args.replicas) < 1 or args.warmup < 0:
        ap.error("--requests, --concurrency, --max-batch-size, --images, --replicas must be >= 1, --warmup >= 0")
    try:
        return _against(args) if args.url else _canonical(args)
    except ValueError as e:  # a non-loopback URL, too few photos for --images
        ap.error(str(e))
    return 2
