"""GPU check: a static-shape raggedvit export replayed as an ORT CUDA graph gives the per-node run's outputs.

    python3 -m benchmarks.check_cuda_graph [--out benchmarks/results] [--model deit_small_patch16_224]
        [--batches 1,4,32] [--policies "topk-l2:keep=0.5:at=4;cls-mass:mass=0.9:at=3,6,9"] [--dtype fp16]
        [--ragged-linear dead-rows]

Exports the model once per policy (';'-separated; seeded weights; adaptive policies, cls-mass and evit with fuse,
in the capacity layout: their only static-shape export) and, per batch size, runs the sample photos through (a) a
plain CUDA-EP session with io binding and (b) raggedvit.runtime.GraphRunner (CUDA graph); records max |Δlogit|
between them, token_counts equality, a replay after new input data (the graph reads the bound buffer), and the
median host time of each (quick look; the end-to-end numbers come from benchmarks.e2e).
Writes <out>/cuda_graph_check_<gpu>.json (overwritten in place); exit 1 when any (policy, batch) disagrees.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks.e2e.cases import parse_policy
from benchmarks.env import result_path
from raggedvit.exporter import export_onnx
from raggedvit.images import sample_inputs, tile
from raggedvit.pruning import PruneSpec
from raggedvit.runtime import GraphRunner, create_session, run_with_iobinding
from raggedvit.timing import measure
from raggedvit.weights import load_vit


def _median_ms(fn, runs: int = 50) -> float:
    return measure(fn, torch.cuda.synchronize, warmup_s=0.0, min_warmup=5, runs=runs).median_ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--model", default="deit_small_patch16_224")
    ap.add_argument("--batches", default="1,4,32")
    ap.add_argument("--policies", default="topk-l2:keep=0.5:at=4", help="policy strings, ';'-separated")
    ap.add_argument("--dtype", default="fp16", choices=("fp32", "fp16", "fp16-all"))
    ap.add_argument("--ragged-linear", default="off", choices=("off", "all", "dead-rows"), help="export option")
    args = ap.parse_args()
    vit, _ = load_vit(args.model, seed=0)
    base = sample_inputs(vit).cuda()
    rows, ok = [], True
    specs = [parse_policy(p) for p in args.policies.split(";") if p]
    with tempfile.TemporaryDirectory() as tmp:
        for i, spec in enumerate(specs):
            capacity = not spec.static_shapes
            linear = False if args.ragged_linear == "off" else args.ragged_linear
            path = export_onnx(vit, spec, Path(tmp) / f"m{i}.onnx", dtype=args.dtype, capacity=capacity,
                               ragged_linear=linear, recipe={"model": args.model})  # fmt: skip
            ok &= _check_export(path, spec, capacity, base, args.batches, rows)
    result_path(args.out, "cuda_graph_check", torch.cuda.get_device_name(0)).write_text(
        json.dumps(
            {"model": args.model, "dtype": args.dtype, "ragged_linear": args.ragged_linear, "rows": rows, "ok": ok},
            indent=1,
        )
    )
    sys.exit(0 if ok else 1)


def _check_export(path: Path, spec: PruneSpec, capacity: bool, base: torch.Tensor, batches: str, rows: list) -> bool:
    """Graph replay vs the per-node run of one export at every batch size; appends a row per batch."""
    ok = True
    plain = create_session(path, "cuda")  # (the Shape -> Concat of the batch size runs on the CPU EP)
    for b in (int(x) for x in batches.split(",")):
        x = tile(base, b)
        row: dict = {"policy": spec.to_dict(), "capacity": capacity, "batch": b}
        try:
            ref_logits, ref_counts = (
                torch.from_numpy(v.numpy()) for v in run_with_iobinding(plain, {"images": x}, output_device="cpu")
            )
            runner = GraphRunner(path, b)
            logits, counts = runner(x)
            row["max_abs_dlogit_graph_vs_plain"] = float((logits.cpu() - ref_logits).abs().max())
            row["token_counts_equal"] = bool(torch.equal(counts.cpu(), ref_counts))
            flipped = x.flip(0).contiguous()  # new data in the bound buffer: the replay must see it
            logits2, counts2 = runner(flipped)
            # against the per-node run of the same flipped batch: the packing order changes float summation order
            # (and with it the adaptive policies' near-tie cuts), so ref_logits.flip(0) is not the same function
            ref2, ref_counts2 = (
                torch.from_numpy(v.numpy()) for v in run_with_iobinding(plain, {"images": flipped}, output_device="cpu")
            )
            row["replay_follows_input"] = bool(
                torch.allclose(logits2.cpu(), ref2, atol=1e-3) and torch.equal(counts2.cpu(), ref_counts2)
            )
            row["plain_ms"] = _median_ms(lambda x=x: run_with_iobinding(plain, {"images": x}, synchronize_torch=False))
            row["graph_ms"] = _median_ms(runner.replay)
            good = (
                row["max_abs_dlogit_graph_vs_plain"] < 1e-3
                and row["token_counts_equal"]
                and row["replay_follows_input"]
            )
        except Exception as exc:  # noqa: BLE001 - recorded
            row["error"] = f"{type(exc).__name__}: {exc}"[:800]
            good = False
        row["ok"] = good
        ok &= good
        rows.append(row)
        print(json.dumps(row), flush=True)
    return ok


if __name__ == "__main__":
    main()
