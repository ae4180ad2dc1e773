"""Probe: why the ragged linear kernel in the model runs slower than `benchmarks.gemm_epilogue`'s plain kernel.

    python3 -m benchmarks.linear_variants [--out benchmarks/results]

Times raggedvit's `_ragged_linear` (JIT) against copies that differ in one structural choice each (constexprs of
`_variant` below): dead tiles leave by an early return instead of an if-block around the K loop, no K-tail mask
(K % BLOCK_K == 0), and the weight read as W^T [K, N] instead of nn.Linear's [N, K]. deit_base shapes, the launch
configs of `raggedvit.kernels._linear_config`, CUDA-graph replays (benchmarks.kernel.graph_time_us). A probe: the
kernels here live only in this file. Writes linear_variants_<date>_<gpu>.json.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

import torch
import triton
import triton.language as tl

from benchmarks.env import environment, probe_result_path
from benchmarks.kernel import graph_time_us
from raggedvit.kernels._linear_config import linear_config
from raggedvit.kernels._linear_kernel import _ragged_linear
from raggedvit.kernels.reference import ragged_linear_reference

SHAPES = {"qkv": (768, 2304, 0, False), "fc1": (768, 3072, 1, False), "fc2": (3072, 768, 0, True)}  # K, N, act, res
ROWS = [(197, 197), (25216, 25216), (25216, 11600), (6304, 2900)]
VARIANTS = {  # name: (EARLY_RETURN, EVEN_K, W_KN)
    "early_return": (True, False, False),
    "early_return_even_k": (True, True, False),
    "early_return_even_k_wt": (True, True, True),
}


@triton.jit
def _variant(X, W, Bias, Res, CU, Y, T, N, K, B, has_res, activation, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, EARLY_RETURN: tl.constexpr, EVEN_K: tl.constexpr,
             W_KN: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    num_m = tl.cdiv(T, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_n
    first_m = (pid // group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % size_m
    pid_n = (pid % group) // size_m
    live = tl.minimum(tl.maximum(tl.load(CU + B), 0), T).to(tl.int32)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    y_ptrs = Y + rows[:, None] * N + cols[None, :]
    out_mask = (rows[:, None] < T) & (cols[None, :] < N)
    if pid_m * BLOCK_M >= live:
        tl.store(y_ptrs, tl.zeros((BLOCK_M, BLOCK_N), dtype=Y.dtype.element_ty), mask=out_mask)
        return
    ks = tl.arange(0, BLOCK_K)
    x_ptrs = X + rows[:, None] * K + ks[None, :]
    if W_KN:
        w_ptrs = W + ks[:, None] * N + cols[None, :]
    else:
        w_ptrs = W + cols[None, :] * K + ks[:, None]
    row_live = rows < live
    col_in = cols < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(x_ptrs, mask=row_live[:, None], other=0.0)
            b = tl.load(w_ptrs, mask=col_in[None, :], other=0.0)
        else:
            k_in = ks < K - k
            a = tl.load(x_ptrs, mask=row_live[:, None] & k_in[None, :], other=0.0)
            b = tl.load(w_ptrs, mask=k_in[:, None] & col_in[None, :], other=0.0)
        acc = tl.dot(a, b, acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K * N if W_KN else BLOCK_K
    acc += tl.load(Bias + cols, mask=col_in, other=0.0).to(tl.float32)[None, :]
    if activation == 1:
        acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
    keep = row_live[:, None] & col_in[None, :]
    if has_res != 0:
        acc += tl.load(Res + rows[:, None] * N + cols[None, :], mask=keep, other=0.0).to(tl.float32)
    tl.store(y_ptrs, tl.where(keep, acc, 0.0).to(Y.dtype.element_ty), mask=out_mask)


def _case(name: str, K: int, N: int, act: int, has_res: bool, T: int, live_rows: int) -> list[dict[str, Any]]:
    """Every implementation on one shape: records with gpu_us (or error) and max_abs_err vs the reference."""
    dev = torch.device("cuda")
    w = (torch.randn(N, K, device=dev) / math.sqrt(K)).half()
    wt = w.t().contiguous()
    b = (torch.randn(N, device=dev) * 0.1).half()
    x = torch.randn(T, K, device=dev).half()
    res = torch.randn(T, N, device=dev).half()
    y = torch.empty(T, N, device=dev, dtype=torch.float16)
    cu = torch.tensor([0, live_rows], device=dev, dtype=torch.int32)
    cfg = linear_config(T, N)
    grid = (triton.cdiv(T, cfg.block_m) * triton.cdiv(N, cfg.block_n),)
    meta = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
                num_warps=cfg.num_warps, num_stages=cfg.num_stages)  # fmt: skip
    want = ragged_linear_reference(x, w, b, res if has_res else None, cu, act).float()

    def ours() -> None:
        _ragged_linear[grid](x, w, b, res, cu, y, T, N, K, 1, 1, int(has_res), 1, act, **meta)

    def variant(er: bool, ek: bool, wkn: bool) -> Any:
        return lambda: _variant[grid](x, wt if wkn else w, b, res, cu, y, T, N, K, 1, int(has_res), act,
                                      EARLY_RETURN=er, EVEN_K=ek, W_KN=wkn, **meta)  # fmt: skip

    fns = {"raggedvit": ours, "cublas_gemm": lambda: torch.nn.functional.linear(x, w, b)}
    fns.update({v: variant(*flags) for v, flags in VARIANTS.items()})
    records = []
    for impl, fn in fns.items():
        rec = {"shape": name, "T": T, "live": live_rows, "K": K, "N": N, "impl": impl, "config": str(cfg)}
        try:
            fn()
            torch.cuda.synchronize()
            if impl != "cublas_gemm":
                rec["max_abs_err"] = (y.float() - want).abs().max().item()
            rec["gpu_us"] = graph_time_us(fn, inner=10, reps=7)[0]
        except Exception as exc:  # noqa: BLE001 - recorded
            rec["error"] = repr(exc)[:200]
        records.append(rec)
    return records


def run() -> dict[str, Any]:
    torch.manual_seed(0)
    records: list[dict[str, Any]] = []
    for name, (K, N, act, has_res) in SHAPES.items():
        for T, live_rows in ROWS:
            recs = _case(name, K, N, act, has_res, T, live_rows)
            records += recs
            line = " ".join(f"{r['impl']}={r['gpu_us']:.1f}" if "gpu_us" in r else f"{r['impl']}=ERR" for r in recs)
            print(f"{name} T={T} live={live_rows}: {line} us", flush=True)
    return {"benchmark": "linear_variants", "env": environment(), "records": records}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    data = run()
    path = probe_result_path(args.out, "linear_variants")
    path.write_text(json.dumps(data, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
