"""Each issue's performance target checked against the committed H200 result files; writes a JSON verdict.

    python3 -m benchmarks.check_targets --kernel K.json --op OP.json --e2e E2E.json \
        --out benchmarks/results/targets.json

Every verdict row names the target, the measured value, the ratio to the target and met/missed, so a missed
target says by how much. Reasons for the misses are in README.md ("Results").
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

PEERS = ("padded_sdpa", "dense_sdpa", "varlen_fa", "nested_sdpa")


def kernel_targets(data: dict) -> list[dict]:
    rows: dict[tuple, dict] = {}
    for r in data["records"]:
        rows.setdefault((r["B"], r["L"], r["lengths"]), {})[r["impl"]] = r
    out = []
    for (B, L, kind), impls in sorted(rows.items()):
        ours = impls["raggedvit"]["gpu_us"]
        peers = {k: v["gpu_us"] for k, v in impls.items() if k in PEERS and v["gpu_us"] is not None}
        best = min(peers, key=peers.get)
        out.append({"target": "kernel GPU time <= best peer", "B": B, "L": L, "lengths": kind, "ours_us": ours,
                    "best_peer": best, "best_peer_us": peers[best], "ratio": ours / peers[best],
                    "met": ours <= peers[best]})  # fmt: skip
        if (B, L, kind) == (128, 197, "uniform"):
            out.append({"target": "B=128 L=197 GPU time <= 54 us", "ours_us": ours, "ratio": ours / 54.0,
                        "met": ours <= 54.0})  # fmt: skip
        if B == 1:
            call = impls["raggedvit"]["call_us"]
            out.append({"target": "B=1 back-to-back call <= 20 us", "L": L, "lengths": kind, "ours_us": call,
                        "ratio": call / 20.0, "met": call <= 20.0})  # fmt: skip
    return out


def op_targets(data: dict) -> list[dict]:
    out = []
    for r in data["rows"]:
        ratio = r["ragged_per_op_us"] / r["packed_mha_per_op_us"]
        out.append({"target": "per-op cost <= 0.75x PackedMultiHeadAttention (gross per-op)", "B": r["B"],
                    "L": r["L"], "lengths": r["mode"], "ours_us": r["ragged_per_op_us"],
                    "packed_mha_us": r["packed_mha_per_op_us"], "ratio": ratio, "met": ratio <= 0.75})  # fmt: skip
    return out


def e2e_targets(data: dict) -> list[dict]:
    """Issue 6's ratios for topk-l2; ours = the faster raggedvit ORT variant (per-node run or CUDA-graph replay).
    The 1.3x bar is the issue's (best of timm eager, ORT fp16, ORT fp16 optimized); the ratio over the unpruned
    optimized graph replayed as a CUDA graph is reported beside it (not part of the issue's bar)."""
    out = []
    for s in data["speedups"]:
        if not s["policy"].startswith("topk-l2"):
            continue
        if s["img_size"] == 224:
            v = s["speedup_vs_best_unpruned"]
            out.append({"target": "ORT pruned >= 1.3x best unpruned (224 px)", "model": s["model"],
                        "batch": s["batch"], "speedup": v, "ours": s.get("ours_variant"),
                        "vs": s["best_unpruned_variant"], "met": v is not None and v >= 1.3,
                        "speedup_vs_unpruned_incl_cuda_graph": s.get("speedup_vs_best_unpruned_incl_graph"),
                        "vs_incl_cuda_graph": s.get("best_unpruned_incl_graph_variant")})  # fmt: skip
        want = 3.0 if s["img_size"] == 384 else 2.5
        if s["batch"] <= 4:  # the issue: ">= 2.5x ... at batch 1-4, >= 3x at 384 px"
            v = s["speedup_vs_padded"]
            out.append({"target": f">= {want}x padded-SDPA pruned PyTorch ({s['img_size']} px)", "model": s["model"],
                        "batch": s["batch"], "speedup": v, "ours": s.get("ours_variant"),
                        "met": v is not None and v >= want})  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", type=Path, required=True)
    ap.add_argument("--op", type=Path, required=True)
    ap.add_argument("--e2e", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    verdict = {
        "sources": {"kernel": args.kernel.name, "op": args.op.name, "e2e": args.e2e.name},
        "kernel": kernel_targets(json.loads(args.kernel.read_text())),
        "ort_op": op_targets(json.loads(args.op.read_text())),
        "e2e": e2e_targets(json.loads(args.e2e.read_text())),
    }
    args.out.write_text(json.dumps(verdict, indent=1))
    for part in ("kernel", "ort_op", "e2e"):
        rows = verdict[part]
        print(f"{part}: {sum(r['met'] for r in rows)}/{len(rows)} targets met")


if __name__ == "__main__":
    main()
