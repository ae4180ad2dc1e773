"""Probe: does ONNX Runtime's TunableOp (the CUDA EP's GEMM tuning at run time) speed up the exports at small batch?

    python3 -m benchmarks.tunable_op [--out benchmarks/results] [--work /tmp/tunable_op]

At B = 1 and 4 the exports' block GEMMs are cuBLAS calls that ONNX Runtime picks by heuristics (split-K with a
workspace allocated inside the graph capture at B = 1: README, "Where a small batch's time goes"). TunableOp
(`tunable_op_enable`, `tunable_op_tuning_enable`) times the candidates it has for an op at its first runs and keeps
the fastest. This probe exports deit_base fp16-all (seeded) unpruned, topk-l2 0.5@4 and cls-mass 0.9@3,6,9 in the
capacity layout, runs each as a CUDA graph (`raggedvit.runtime.GraphRunner`) at B = 1, 4 and 32 with the CUDA EP's
default options and with TunableOp on, and records the wall time per call (median of 7 rounds of 50 synchronous
replays) and the logits' max |difference| against the default session's on the same seeded images.
Writes tunable_op_<date>_<gpu>.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

import raggedvit.runtime as rt
from benchmarks.env import environment, probe_result_path

MODEL = "deit_base_patch16_224"
EXPORTS = {
    "none": ["--policy", "none"],
    "topk-l2": ["--policy", "topk-l2", "--keep", "0.5", "--prune-at", "4"],
    "cls-mass-capacity": ["--policy", "cls-mass", "--mass", "0.9", "--prune-at", "3,6,9", "--capacity"],
}
VARIANTS: dict[str, dict[str, str]] = {
    "default": {},
    "tunable": {"tunable_op_enable": "1", "tunable_op_tuning_enable": "1", "tunable_op_max_tuning_duration_ms": "30"},
}
BATCHES = (1, 4, 32)


def export_all(work: Path) -> dict[str, Path]:
    """The three fp16-all exports of MODEL (seed 0), in parallel subprocesses of `raggedvit export`."""
    work.mkdir(parents=True, exist_ok=True)
    paths = {name: work / f"{name}.onnx" for name in EXPORTS}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "raggedvit.cli",
                "export",
                MODEL,
                "--seed",
                "0",
                "--dtype",
                "fp16-all",
                *args,
                "-o",
                str(paths[name]),
            ],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        for name, args in EXPORTS.items()
    ]
    for p in procs:
        if p.wait() != 0:
            raise RuntimeError(f"export failed: {p.args}")
    return paths


def time_runner(
    path: Path, batch: int, images: torch.Tensor, extra: dict[str, str]
) -> tuple[torch.Tensor, list[float]]:
    """(logits on the CPU, us per call of 7 rounds) of a GraphRunner whose CUDA EP options get `extra`."""
    runner = rt.GraphRunner(path, batch, cuda_options=extra)
    logits = runner(images)[0].float().cpu().clone()
    for _ in range(20):
        runner.replay()
    rounds = []
    for _ in range(7):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(50):
            runner.replay()
        rounds.append((time.perf_counter() - t0) / 50 * 1e6)
    return logits, rounds


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--work", default="/tmp/tunable_op")
    args = ap.parse_args(argv)
    paths = export_all(Path(args.work))
    gen = torch.Generator().manual_seed(0)
    records: list[dict[str, Any]] = []
    for name, path in paths.items():
        for batch in BATCHES:
            images = torch.randn(batch, 3, 224, 224, generator=gen)
            ref = None
            for variant, extra in VARIANTS.items():
                rec: dict[str, Any] = {"export": name, "batch": batch, "variant": variant}
                try:
                    logits, rounds = time_runner(path, batch, images, extra)
                    ref = logits if ref is None else ref
                    rec.update(us_per_call=statistics.median(rounds), rounds_us=rounds,
                               max_abs_diff_vs_default=float((logits - ref).abs().max()))  # fmt: skip
                except Exception as exc:  # noqa: BLE001 - recorded, not raised
                    rec["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
                records.append(rec)
                print(rec, flush=True)
    path = probe_result_path(args.out, "tunable_op")
    path.write_text(json.dumps({"benchmark": "tunable_op", "env": environment(), "records": records}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
