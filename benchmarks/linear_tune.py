"""Probe: launch configs of raggedvit's ragged linear kernel on deit_base's block GEMMs, against cuBLAS.

    python3 -m benchmarks.linear_tune [--out benchmarks/results] [--quick]

For each block GEMM (qkv, proj + residual, fc1 + GELU, fc2 + residual) and row count (B=1 full / pruned, B=32,
B=128 full / pruned) times `_ragged_linear` (nn.Linear's W [N, K]) and the probe kernel of
`benchmarks.linear_variants` with W^T [K, N] under every config of CONFIGS, and the cuBLAS peers: F.linear alone
and F.linear followed by the separate epilogue (GELU / residual add), as ONNX Runtime runs them. CUDA-graph
replays (benchmarks.kernel.graph_time_us). Writes linear_tune_<date>_<gpu>.json; prints the best config per case.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
import triton

from benchmarks._gemm_case import BLOCK_GEMMS, GemmCase, time_impls
from benchmarks.env import environment, probe_result_path
from benchmarks.linear_variants import _variant
from raggedvit.kernels._linear_kernel import _ragged_linear

ROWS = (197, 99, 25216, 12672)  # B=1 full / topk-pruned, B=128 full / pruned
SMALL = {  # (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)
    (64, 32, 64, 4, 4), (64, 64, 64, 4, 4), (64, 64, 128, 4, 3), (64, 128, 64, 4, 4), (32, 64, 128, 4, 4),
    (32, 32, 128, 4, 4), (64, 32, 128, 4, 4), (16, 64, 128, 4, 4), (64, 128, 128, 8, 3),
}  # fmt: skip
LARGE = {
    (128, 128, 64, 8, 3), (128, 128, 64, 4, 4), (128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (256, 128, 64, 8, 3),
    (128, 128, 128, 8, 3), (64, 256, 64, 4, 4), (128, 64, 64, 4, 4), (128, 256, 32, 8, 4), (64, 128, 64, 4, 4),
}  # fmt: skip


def _case(name: str, T: int, quick: bool) -> list[dict[str, Any]]:
    c = GemmCase.make(name, T, T)
    x, w, wt, b, res, y, cu, K, N, act, has_res = c.x, c.w, c.wt, c.b, c.res, c.y, c.cu, c.K, c.N, c.act, c.has_res
    fns = c.peers()
    configs = sorted(SMALL if T < 1024 else LARGE)
    if quick:
        configs = configs[:3]
    for bm, bn, bk, nw, ns in configs:
        grid = (triton.cdiv(T, bm) * triton.cdiv(N, bn),)
        meta = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=nw, num_stages=ns)
        tag = f"{bm}x{bn}x{bk}_w{nw}_s{ns}"
        fns[f"nk_{tag}"] = (lambda g=grid, m=meta: _ragged_linear[g](
            x, w, b, res, cu, y, T, N, K, 1, 1, int(has_res), 1, act, **m))  # fmt: skip
        kn = dict(meta, EARLY_RETURN=True, EVEN_K=True, W_KN=True)
        fns[f"kn_{tag}"] = lambda g=grid, m=kn: _variant[g](x, wt, b, res, cu, y, T, N, K, 1, int(has_res), act, **m)
    return time_impls(c, fns, {"shape": name, "T": T, "K": K, "N": N}, "tflops", T)


def run(quick: bool, path: Path) -> dict[str, Any]:
    torch.manual_seed(0)
    records: list[dict[str, Any]] = []
    data = {"benchmark": "linear_tune", "env": environment(), "records": records}
    for name in BLOCK_GEMMS:
        for T in ROWS:
            recs = _case(name, T, quick)
            records += recs
            ok = [r for r in recs if "gpu_us" in r]
            peers = {r["impl"]: r["gpu_us"] for r in ok if r["impl"].startswith("cublas")}
            best = sorted((r for r in ok if not r["impl"].startswith("cublas")), key=lambda r: r["gpu_us"])[:3]
            line = " ".join(f"{r['impl']}={r['gpu_us']:.1f}" for r in best)
            print(f"{name} T={T}: cublas={peers.get('cublas_gemm', 0):.1f} unfused={peers.get('cublas_unfused', 0):.1f}"
                  f" | best {line} us", flush=True)  # fmt: skip
            path.write_text(json.dumps(data, indent=1))  # after every case: a cut-off run keeps what it measured
    return data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--quick", action="store_true", help="three configs per case (a smoke run)")
    args = ap.parse_args()
    path = probe_result_path(args.out, "linear_tune")
    run(args.quick, path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
