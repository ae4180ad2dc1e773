"""Markdown tables for the README from the benchmark JSON files (kernel and ORT-op benchmarks).

    python3 -m benchmarks.readme_results --kernel KERNEL_BENCH.json --op ORT_OP_BENCH.json

The end-to-end tables come from benchmarks.readme_table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

KERNEL_IMPLS = ("raggedvit", "raggedvit+cls", "padded_sdpa", "dense_sdpa", "varlen_fa", "nested_sdpa")


def _fmt(x: float | None) -> str:
    return "—" if x is None else (f"{x:.0f}" if x >= 1000 else f"{x:.1f}")


def kernel_table(path: Path) -> str:
    data = json.loads(path.read_text())
    recs = data["records"]
    keys = sorted({(r["B"], r["L"], r["lengths"]) for r in recs}, key=lambda k: (k[2] != "uniform", k[1], k[0]))
    lines = [
        f"GPU time / isolated-call time in µs, fp16, H=12, D=64 ({data['gpu']}, torch {data['torch']}, "
        f"triton {data['triton']}, {data['date'][:10]}; `{path.name}`)",
        "",
        "| B | L | lengths | bytes floor | " + " | ".join(KERNEL_IMPLS) + " |",
        "|---:|---:|---|---:|" + "---:|" * len(KERNEL_IMPLS),
    ]
    for B, L, kind in keys:
        row = {r["impl"]: r for r in recs if (r["B"], r["L"], r["lengths"]) == (B, L, kind)}
        floor = row.get("bytes_floor", {}).get("gpu_us")
        cells = []
        for impl in KERNEL_IMPLS:
            r = row.get(impl)
            cells.append("—" if r is None or r["gpu_us"] is None else f"{_fmt(r['gpu_us'])} / {_fmt(r['call_us'])}")
        lines.append(f"| {B} | {L} | {kind} | {_fmt(floor)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def op_table(path: Path) -> str:
    data = json.loads(path.read_text())
    lines = [
        f"Per-op µs inside ORT graphs ({data['gpu']}, onnxruntime {data['onnxruntime']}, {data['date'][:10]}; "
        f"`{path.name}`). Gross = (t12 − t1) / 11 of chains with identical glue; net = gross − glue-only chain.",
        "",
        "| lengths | B | L | T | RaggedAttention gross | PackedMHA gross | ratio | RaggedAttention net | PackedMHA net"
        " | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in data["rows"]:
        g, p = r["ragged_per_op_us"], r["packed_mha_per_op_us"]
        gn, pn = r["ragged_net_us"], r["packed_mha_net_us"]
        lines.append(
            f"| {r['mode']} | {r['B']} | {r['L']} | {r['T']} | {g:.1f} | {p:.1f} | {g / p:.2f} | {gn:.1f} | {pn:.1f} "
            f"| {gn / pn:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", type=Path)
    ap.add_argument("--op", type=Path)
    args = ap.parse_args()
    if args.kernel:
        print(kernel_table(args.kernel), end="\n\n")
    if args.op:
        print(op_table(args.op))


if __name__ == "__main__":
    main()
