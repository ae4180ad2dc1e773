"""Probe: GPU time of the selection kernels (`raggedvit/kernels/_select_kernel.py`) per launch config.

    python3 -m benchmarks.select_tune [--out benchmarks/results]

The H200 serving profile (benchmarks/results/serving_2026-12-01_NVIDIA-H200_run4.json) had 11-22 us per
`_select_scatter` / `_select_count` launch (pairwise path) at batch 1, one program of a few hundred comparisons' work:
this times both kernels alone (CUDA-graph replays, benchmarks.kernel.graph_time_us) for deit's 197-token images at
B = 1, 4, 32, 128, both policies: the sorted path over (WP, num_warps) and the pairwise path (WP below the width)
over (BLOCK, num_warps), next to an empty Triton kernel (the launch floor). Writes select_tune_<date>_<gpu>.json and
prints one line per case; the shipped config (select_launch_config) is marked.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
import triton

from benchmarks.env import environment, probe_result_path
from benchmarks.kernel import graph_time_us
from raggedvit.kernels import _select_kernel as K
from raggedvit.kernels._select_launch import float_bits

PAIRWISE = ((64, 4), (128, 4), (128, 8), (256, 8))  # (BLOCK, num_warps) with WP = 16 < the width
SORTED = ((256, 1), (256, 2), (256, 4), (256, 8), (512, 4), (512, 8))  # (WP, num_warps), BLOCK = SELECT_BLOCK
BATCHES = (1, 4, 32, 128)
WIDTH, PREFIX = 197, 1


@triton.jit
def _empty(X):
    pass


def _case(B: int, policy: int) -> list[dict[str, Any]]:
    dev = torch.device("cuda")
    gen = torch.Generator(device="cpu").manual_seed(B)
    T = B * WIDTH
    scores = torch.rand(T, generator=gen).to(dev)
    cu = torch.arange(B + 1, dtype=torch.int64, device=dev) * WIDTH
    bound = WIDTH
    k = torch.empty(B, dtype=torch.int64, device=dev)
    src, seq, pos = (torch.empty(B * bound, dtype=torch.int64, device=dev) for _ in range(3))
    cu_new = torch.empty(B + 1, dtype=torch.int64, device=dev)
    keep, mass = float_bits(0.5), float_bits(0.9)
    records = [{"B": B, "policy": policy, "kernel": "empty", "gpu_us": graph_time_us(lambda: _empty[(B,)](k))[0]}]
    shipped = K.select_launch_config(WIDTH)
    variants = [("pairwise", blk, 16, w) for blk, w in PAIRWISE]
    variants += [("sorted", K.SELECT_BLOCK, wp, w) for wp, w in SORTED]
    for path, block, wp, warps in variants:

        def count(block=block, wp=wp, warps=warps) -> None:
            K._select_count[(B,)](scores, cu, k, T, B, WIDTH, PREFIX, policy, keep, mass, BLOCK=block, WP=wp,
                                  num_warps=warps)  # fmt: skip

        def scatter(block=block, wp=wp, warps=warps) -> None:
            K._select_scatter[(B,)](scores, cu, k, src, cu_new, seq, pos, T, B, WIDTH, bound, PREFIX, BLOCK=block,
                                    WP=wp, num_warps=warps)  # fmt: skip

        for name, fn in (("count", count), ("scatter", scatter)):
            rec: dict[str, Any] = {"B": B, "policy": policy, "kernel": name, "path": path, "block": block, "wp": wp}
            rec.update(num_warps=warps, shipped=path == "sorted" and (wp, warps) == shipped)
            try:
                rec["gpu_us"] = graph_time_us(fn, inner=20, reps=9)[0]
            except Exception as exc:  # noqa: BLE001 - recorded (e.g. out of registers / shared memory)
                rec["error"] = repr(exc)[:200]
            records.append(rec)
    return records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    path = probe_result_path(args.out, "select_tune")
    records: list[dict[str, Any]] = []
    data = {"benchmark": "select_tune", "env": environment(), "width": WIDTH, "records": records}
    for B in BATCHES:
        for policy in (0, 1):
            recs = _case(B, policy)
            records += recs
            cells = " ".join(
                f"{r['kernel'][:2]}{'*' if r.get('shipped') else ''}{r.get('path', '')[:1]}"
                f"{r.get('wp') if r.get('path') == 'sorted' else r.get('block', '')}/{r.get('num_warps', '')}="
                + (f"{r['gpu_us']:.1f}" if "gpu_us" in r else "ERR")
                for r in recs
            )
            print(f"B={B} policy={policy}: {cells}", flush=True)
            path.write_text(json.dumps(data, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
