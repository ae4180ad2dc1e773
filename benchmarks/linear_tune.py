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
import datetime as dt
import json
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import triton

from benchmarks.env import environment
from benchmarks.kernel import graph_time_us
from benchmarks.linear_variants import _variant
from raggedvit.kernels._linear_kernel import _ragged_linear
from raggedvit.kernels.reference import ragged_linear_reference

SHAPES = {"qkv": (768, 2304, 0, False), "proj": (768, 768, 0, True), "fc1": (768, 3072, 1, False),
          "fc2": (3072, 768, 0, True)}  # fmt: skip  # K, N, activation, residual
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
    K, N, act, has_res = SHAPES[name]
    dev = torch.device("cuda")
    w = (torch.randn(N, K, device=dev) / math.sqrt(K)).half()
    wt = w.t().contiguous()
    b = (torch.randn(N, device=dev) * 0.1).half()
    x = torch.randn(T, K, device=dev).half()
    res = torch.randn(T, N, device=dev).half()
    y = torch.empty(T, N, device=dev, dtype=torch.float16)
    cu = torch.tensor([0, T], device=dev, dtype=torch.int32)
    want = ragged_linear_reference(x, w, b, res if has_res else None, cu, act).float()

    def peer_fused() -> None:
        z = F.linear(x, w, b)
        if act:
            z = F.gelu(z)
        if has_res:
            z = z + res

    fns: dict[str, Any] = {"cublas_gemm": lambda: F.linear(x, w, b), "cublas_unfused": peer_fused}
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
    records = []
    for impl, fn in fns.items():
        rec: dict[str, Any] = {"shape": name, "T": T, "K": K, "N": N, "impl": impl}
        try:
            y.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            if not impl.startswith("cublas"):
                err = (y.float() - want).abs().max().item()
                rec["max_abs_err"] = err
                if not err < 0.05:
                    rec["error"] = f"wrong result: max abs err {err}"
                    records.append(rec)
                    continue
            rec["gpu_us"] = graph_time_us(fn, inner=10, reps=7)[0]
            rec["tflops"] = 2 * T * N * K / rec["gpu_us"] / 1e6
        except Exception as exc:  # noqa: BLE001 - recorded (e.g. out of shared memory)
            rec["error"] = repr(exc)[:200]
        records.append(rec)
    return records


def run(quick: bool, path: Path) -> dict[str, Any]:
    torch.manual_seed(0)
    records: list[dict[str, Any]] = []
    data = {"benchmark": "linear_tune", "env": environment(), "records": records}
    for name in SHAPES:
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
    gpu = torch.cuda.get_device_name(0).replace(" ", "-")
    path = Path(args.out) / f"linear_tune_{dt.date.today().isoformat()}_{gpu}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    run(args.quick, path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
