"""Benchmark the fused merge kernel (RaggedMerge's Triton kernel, `_merge_launch.launch_merge`) against the
standard-op merge (`merge_tokens_reference` under torch on CUDA: ~80 kernels, what a tome export ran before the
fused op) at deit_small shapes: n = 197, C = 384, H = 6, Dh = 64, one class token, r = 8, B = 1, 32, 128, with the
block's attention residual and proj bias fused in (skip, skip_bias), as the export runs it.

Two timings per (B, dtype, impl), as benchmarks/kernel.py takes them: gpu_us = CUDA-graph replay of 20 back-to-back
calls / 20 (median of replays; the export runs inside a CUDA graph, one node per merging block), call_us = host wall
time of back-to-back eager calls incl. dispatch. bytes = x and skip read + the k third of qkv read + x_out written
(the kernel's floor); gbps = bytes / gpu_us of the kernel. Before timing, each shape is checked: the kernel's src equals
the reference's on every image whose decisions are clear of float32 rounding (`src_equal`: their fraction) and
`x_max_abs_diff` over those images.

    python -m benchmarks.merge_kernel [--dtypes float16,float32] [--batches 1,32,128] [--out benchmarks/results]

Writes <out>/merge_kernel_<gpu>.json (overwritten in place) and prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from benchmarks.env import environment, result_path
from benchmarks.kernel import call_time_us, graph_time_us
from raggedvit.kernels._merge_launch import launch_merge
from raggedvit.pruning.merge import merge_tokens_reference, merged_count
from tests.support.merge_kernel_cases import MARGIN, MergeCase, decision_margins, make_merge_inputs, make_skip_inputs

RESULTS = Path(__file__).resolve().parent / "results"

N, C, H, DH, P, R = 197, 384, 6, 64, 1, 8


def _check(case: MergeCase, args: tuple, skip: dict) -> dict:
    """src agreement and the largest x difference on the images whose decisions are safe."""
    got = launch_merge(*args, **skip)
    ref = merge_tokens_reference(*args, **skip)
    torch.cuda.synchronize()
    x, qkv, bias = args[:3]
    safe = decision_margins(qkv, bias, case.B, N, H, P, R, True) > MARGIN
    m = N - merged_count(N, P, R)
    rows = safe.repeat_interleave(m).to(x.device)
    src_ok = torch.equal(got[3][rows], ref[3][rows])
    diff = (got[0][rows].float() - ref[0][rows].float()).abs().max().item() if bool(rows.any()) else 0.0
    return {"safe_images": int(safe.sum()), "src_equal": src_ok, "x_max_abs_diff": diff}


def run(dtypes: list[torch.dtype], batches: list[int]) -> dict:
    records = []
    t0 = time.time()
    for dtype in dtypes:
        for B in batches:
            case = MergeCase(f"deit_small-b{B}", B, N, H, DH, P, R, True, dtype, skip="skip-bias")
            x, qkv, bias, size, cu = (t.cuda() if t is not None else None for t in make_merge_inputs(case, seed=B))
            skip = {k: v.cuda() for k, v in make_skip_inputs(case, seed=B).items()}
            args = (x, qkv, bias, size, cu, H, P, R, True)
            base = {"B": B, "dtype": str(dtype).removeprefix("torch."), "n": N, "C": C, "H": H, "r": R, "skip": True}
            check = _check(case, args, skip)
            nbytes = (2 * x.numel() + qkv.numel() // 3 + B * (N - merged_count(N, P, R)) * C) * x.element_size()
            impls = {"triton_merge": lambda a=args, s=skip: launch_merge(*a, **s),
                     "torch_reference": lambda a=args, s=skip: merge_tokens_reference(*a, **s)}  # fmt: skip
            for name, fn in impls.items():
                try:
                    gpu_us, note = graph_time_us(fn)
                    call_us = call_time_us(fn, calls=50 if name == "torch_reference" else 200)
                except Exception as exc:  # noqa: BLE001 - record the failure, time the rest
                    gpu_us, call_us, note = None, None, f"failed: {exc!r}"[:200]
                rec = {**base, "impl": name, "gpu_us": gpu_us, "call_us": call_us, "note": note}
                if name == "triton_merge":
                    rec.update(check, bytes=nbytes, gbps=nbytes / gpu_us / 1e3 if gpu_us else None)
                records.append(rec)
            ref_us = records[-1]["gpu_us"]
            if ref_us and records[-2]["gpu_us"]:
                records[-2]["speedup_vs_reference"] = ref_us / records[-2]["gpu_us"]
    return {"benchmark": "merge_kernel", **environment(), "seconds": round(time.time() - t0, 1), "records": records}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", default="float16,float32", help="comma-separated torch dtypes")
    ap.add_argument("--batches", default="1,32,128", help="comma-separated batch sizes")
    ap.add_argument("--out", type=Path, default=RESULTS, help="output folder (benchmarks/results)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks.merge_kernel needs a CUDA GPU")
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",") if d]
    result = run(dtypes, [int(b) for b in args.batches.split(",") if b])
    line = json.dumps(result)
    print(line)
    path = result_path(args.out, "merge_kernel", (result.get("gpu") or {}).get("name"))
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
