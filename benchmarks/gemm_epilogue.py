"""Probe for issue 13's next lever: can a Triton GEMM with a fused epilogue and a device-side live-row count replace
cuBLAS + ORT's separate epilogue kernels in a pruned ViT block on this GPU?

    python3 -m benchmarks.gemm_epilogue [--out benchmarks/results] [--quick]

For deit_base's four block GEMMs (y = x @ W^T + b, fp16, fp32 accumulation) at the row counts of the serving
batches, it times (CUDA-graph replays of 10 calls, median per call):
  cublas_gemm     F.linear alone (cuBLAS with its bias epilogue): the floor a fused op must approach
  cublas_unfused  F.linear, then GELU (fc1) or + residual (fc2, proj) as separate kernels, as the ORT graph runs them
  triton          one Triton kernel: GEMM + bias + GELU / residual, row tiles at or past the live count exit at once
  triton_tma      the same, persistent over the SMs, loads and stores through TMA descriptors (Hopper)
Each Triton variant sweeps tile configs and keeps the best; `live` < M rows shows what skipping dead rows of the
capacity layout buys (cuBLAS always computes M rows). Writes gemm_epilogue_<date>_<gpu>.json. A probe, not a
raggedvit op: the kernels here live only in this file.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from benchmarks.env import environment, probe_result_path
from benchmarks.kernel import graph_time_us

C = 768  # deit_base width
SHAPES = {"qkv": (C, 3 * C, 0), "proj": (C, C, 2), "fc1": (C, 4 * C, 1), "fc2": (4 * C, C, 2)}  # K, N, epilogue
EPILOGUES = {0: "bias", 1: "bias+gelu", 2: "bias+residual"}
# (M capacity, live rows): B=1 full / pruned, B=4, B=32, B=128 full / pruned, cls-mass capacity at 46% live
ROWS = [(197, 197), (99, 99), (788, 788), (6304, 6304), (25216, 25216), (12672, 12672), (25216, 11600)]
CONFIGS = [  # BM, BN, BK, warps, stages
    (64, 64, 64, 4, 4), (64, 128, 64, 4, 4), (128, 64, 64, 4, 4), (128, 128, 64, 4, 4), (128, 128, 64, 8, 3),
    (128, 256, 64, 8, 3), (64, 256, 64, 4, 3), (256, 128, 64, 8, 3), (128, 128, 32, 4, 5), (64, 32, 64, 4, 4),
]  # fmt: skip


@triton.jit
def _epilogue(acc, Bias, Res, offs_m, offs_n, N, live, stride_r, EPI: tl.constexpr):
    acc += tl.load(Bias + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    if EPI == 1:
        acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
    if EPI == 2:
        mask = (offs_m[:, None] < live) & (offs_n[None, :] < N)
        acc += tl.load(Res + offs_m[:, None] * stride_r + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
    return acc


@triton.jit
def _linear(X, WT, Bias, Res, Y, Live, M, N, K, EPI: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
            BK: tl.constexpr, GROUP_M: tl.constexpr):  # fmt: skip
    """X [M, K], WT [K, N], Y/Res [M, N] row-major; grid = cdiv(M, BM) * cdiv(N, BN); rows >= Live[0] unwritten."""
    live = tl.load(Live)
    pid = tl.program_id(0)
    num_m, num_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    group = GROUP_M * num_n
    first_m = (pid // group) * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % size_m
    pid_n = (pid % group) // size_m
    if pid_m * BM >= live:
        return
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    xp = X + offs_m[:, None] * K + offs_k[None, :]
    wp = WT + offs_k[:, None] * N + offs_n[None, :]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for _ in range(0, K, BK):
        a = tl.load(xp, mask=offs_m[:, None] < M, other=0.0)
        b = tl.load(wp, mask=offs_n[None, :] < N, other=0.0)
        acc = tl.dot(a, b, acc)
        xp += BK
        wp += BK * N
    acc = _epilogue(acc, Bias, Res, offs_m, offs_n, N, live, N, EPI)
    mask = (offs_m[:, None] < live) & (offs_n[None, :] < N)
    tl.store(Y + offs_m[:, None] * N + offs_n[None, :], acc.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _linear_tma(x_desc, w_desc, y_desc, Bias, Res, Live, M, N, K, EPI: tl.constexpr, BM: tl.constexpr,
                BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr):  # fmt: skip
    """Persistent: grid = NUM_SMS programs loop over the live row tiles (count read on the device)."""
    live = tl.load(Live)
    num_m, num_n = tl.cdiv(live, BM), tl.cdiv(N, BN)
    group = GROUP_M * num_n
    for tile in tl.range(tl.program_id(0), num_m * num_n, NUM_SMS, flatten=True):
        first_m = (tile // group) * GROUP_M
        size_m = min(num_m - first_m, GROUP_M)
        pid_m = first_m + (tile % group) % size_m
        pid_n = (tile % group) // size_m
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for ki in range(0, tl.cdiv(K, BK)):
            a = x_desc.load([pid_m * BM, ki * BK])
            b = w_desc.load([ki * BK, pid_n * BN])
            acc = tl.dot(a, b, acc)
        offs_m = pid_m * BM + tl.arange(0, BM)
        offs_n = pid_n * BN + tl.arange(0, BN)
        acc = _epilogue(acc, Bias, Res, offs_m, offs_n, N, live, N, EPI)
        y_desc.store([pid_m * BM, pid_n * BN], acc.to(tl.float16))


def _triton_fn(kind: str, cfg: tuple, epi: int, x, wt, b, res, y, live) -> Any:
    """A no-argument launch of the `kind` kernel with tile config `cfg` on preallocated tensors."""
    bm, bn, bk, warps, stages = cfg
    M, K = x.shape
    N = wt.shape[1]
    if kind == "triton":
        grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
        return lambda: _linear[grid](x, wt, b, res, y, live, M, N, K, epi, bm, bn, bk, 8, num_warps=warps,
                                     num_stages=stages)  # fmt: skip
    from triton.tools.tensor_descriptor import TensorDescriptor

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    xd = TensorDescriptor.from_tensor(x, [bm, bk])
    wd = TensorDescriptor.from_tensor(wt, [bk, bn])
    yd = TensorDescriptor.from_tensor(y, [bm, bn])
    grid = (min(sms, triton.cdiv(M, bm) * triton.cdiv(N, bn)),)
    return lambda: _linear_tma[grid](xd, wd, yd, b, res, live, M, N, K, epi, bm, bn, bk, 8, sms, num_warps=warps,
                                     num_stages=stages)  # fmt: skip


def _reference(x, wt, b, res, epi: int, live: int) -> torch.Tensor:
    y = (x[:live].float() @ wt.float()) + b.float()
    if epi == 1:
        y = F.gelu(y)
    if epi == 2:
        y = y + res[:live].float()
    return y


def run(quick: bool) -> dict[str, Any]:
    torch.manual_seed(0)
    dev = torch.device("cuda")
    records: list[dict[str, Any]] = []
    rows = ROWS[:1] + ROWS[3:5] + ROWS[-1:] if quick else ROWS
    for name, (K, N, epi) in SHAPES.items():
        w = (torch.randn(N, K, device=dev) / math.sqrt(K)).half()
        wt = w.t().contiguous()
        b = (torch.randn(N, device=dev) * 0.1).half()
        for M, live_rows in rows:
            x = torch.randn(M, K, device=dev).half()
            res = torch.randn(M, N, device=dev).half()
            y = torch.empty(M, N, device=dev, dtype=torch.float16)
            live = torch.tensor([live_rows], device=dev, dtype=torch.int32)
            base = {"shape": name, "M": M, "live": live_rows, "K": K, "N": N, "epilogue": EPILOGUES[epi]}
            records.append(
                {**base, "impl": "cublas_gemm", "gpu_us": graph_time_us(lambda x=x, w=w, b=b: F.linear(x, w, b))[0]}
            )

            def unfused(x=x, w=w, b=b, res=res, epi=epi) -> torch.Tensor:
                out = F.linear(x, w, b)
                return F.gelu(out) if epi == 1 else (out + res if epi == 2 else out)

            records.append({**base, "impl": "cublas_unfused", "gpu_us": graph_time_us(unfused)[0]})
            want = _reference(x, wt, b, res, epi, live_rows)
            for kind in ("triton", "triton_tma"):
                best: dict[str, Any] | None = None
                tried = []
                for cfg in CONFIGS[:5] if quick else CONFIGS:
                    try:
                        fn = _triton_fn(kind, cfg, epi, x, wt, b, res, y, live)
                        fn()
                        torch.cuda.synchronize()
                        err = (y[:live_rows].float() - want).abs().max().item()
                        us = graph_time_us(fn, inner=10, reps=7)[0]
                    except Exception as exc:  # noqa: BLE001 - out of resources, API missing on this Triton
                        tried.append({"config": cfg, "error": repr(exc)[:160]})
                        continue
                    tried.append({"config": cfg, "gpu_us": us, "max_abs_err": err})
                    if err < 0.05 * max(1.0, want.abs().max().item()) and (best is None or us < best["gpu_us"]):
                        best = {"config": cfg, "gpu_us": us, "max_abs_err": err}
                rec = {**base, "impl": kind, "gpu_us": None if best is None else best["gpu_us"], "best": best}
                records.append({**rec, "tried": tried})
            line = " ".join(
                f"{r['impl']}={r['gpu_us']:.1f}" if r["gpu_us"] else f"{r['impl']}=-"
                for r in records
                if all(r[k] == base[k] for k in base)
            )
            print(f"{name:4s} M={M:5d} live={live_rows:5d}: {line} us", flush=True)
    return {"benchmark": "gemm_epilogue", "env": environment(), "dtype": "fp16", "shapes": SHAPES,
            "rows": rows, "configs": CONFIGS, "timing": "CUDA-graph replay of 10 calls, median of 7 (benchmarks.kernel"
            ".graph_time_us)", "records": records}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--quick", action="store_true", help="4 row counts, 5 configs")
    args = ap.parse_args()
    data = run(args.quick)
    path = probe_result_path(args.out, "gemm_epilogue")
    path.write_text(json.dumps(data, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
