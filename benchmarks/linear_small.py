"""Probe: can the ragged linear kernel beat cuBLAS over the whole capacity at serving batch sizes (B = 1, 4, 32),
where the capacity layout's live rows are a fraction of its static row count?

    python3 -m benchmarks.linear_small [--out benchmarks/results] [--quick]

At B = 1-4 a cls-mass 0.9@3,6,9 capacity export runs every GEMM after the first stage over B x 197 rows while only
~46% / 24% / 14% of them are live (the sample photos' kept counts). cuBLAS cannot skip the dead rows; the shipped
`_ragged_linear` can, but at these sizes it is latency-bound (too few programs, a long K loop) and ran slower than
cuBLAS over the full capacity (serving run10: 10 us per call at B = 4 against 7.8 us). This probe times, for
deit_base's and deit_small's block GEMMs at those capacities and live counts:

- the cuBLAS peers over the capacity (what the MatMul export runs) and over the live rows only (a floor no static
  graph reaches);
- `_ragged_linear` under its shipped config (`linear_config`);
- a split-K variant of it over a grid of tiles: the K range is cut into SPLIT_K slices, each program writes its
  fp32 partial tile to a workspace, and the last program of a tile to arrive (an acq_rel atomic on a per-tile
  counter, which it resets to 0) sums the slices in slice order (deterministic) and applies the epilogue.

Tiles wholly past the live count store zeros without a K loop. The kernel lives only in this file: the AOT build
and the ORT op do not use it. Writes linear_small_<date>_<gpu>.json and prints the best configs per case.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from benchmarks._gemm_case import GemmCase
from benchmarks.env import environment, probe_result_path
from benchmarks.kernel import graph_time_us
from raggedvit.kernels._linear_config import linear_config
from raggedvit.kernels._linear_kernel import _ragged_linear

# name -> (K, N, activation, residual) for deit_base (D = 768) and deit_small (D = 384)
SHAPES = {
    f"{m}_{g}": (k * d, n * d, act, res)
    for m, d in (("base", 768), ("small", 384))
    for g, (k, n, act, res) in {
        "qkv": (1, 3, 0, False),
        "proj": (1, 1, 0, True),
        "fc1": (1, 4, 1, False),
        "fc2": (4, 1, 0, True),
    }.items()  # fmt: skip
}
LIVE = (0.46, 0.24, 0.14)  # live fraction of the capacity after each cls-mass stage (the sample photos' means)
BATCHES = (1, 4, 32, 128)
TOKENS = 197
TILES = [(bm, bn, bk) for bm in (16, 32, 64) for bn in (32, 64, 128) for bk in (64, 128)]
SPLITS = {768: (1, 2, 3, 4), 384: (1, 2, 3), 3072: (1, 2, 4, 6, 8), 1536: (1, 2, 4, 6)}
LARGE_TILES = [(128, 128, 64, 8, 3), (128, 256, 64, 8, 4), (64, 128, 64, 4, 4), (64, 64, 64, 4, 4), (128, 64, 64, 4, 4)]


@triton.jit(do_not_specialize=["T", "B", "has_res", "activation"])
def _sk_linear(X, W, Bias, Res, CU, Y, WS, LOCK, T, N, K, B, has_res, activation,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
               GROUP_M: tl.constexpr):  # fmt: skip
    tile = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_m = tl.cdiv(T, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_n
    first_m = (tile // group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (tile % group) % size_m
    pid_n = (tile % group) // size_m
    live = tl.minimum(tl.maximum(tl.load(CU + B), 0), T).to(tl.int32)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_in = cols < N
    y_ptrs = Y + rows.to(tl.int64)[:, None] * N + cols[None, :]
    if pid_m * BLOCK_M >= live:
        if pid_k == 0:
            zero = tl.zeros((BLOCK_M, BLOCK_N), dtype=Y.dtype.element_ty)
            tl.store(y_ptrs, zero, mask=(rows < T)[:, None] & col_in[None, :])
        return
    k_span = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
    k_lo = pid_k * k_span
    k_hi = tl.minimum(k_lo + k_span, K)
    ks = tl.arange(0, BLOCK_K)
    row_live = rows < live
    x_ptrs = X + rows.to(tl.int64)[:, None] * K + (k_lo + ks)[None, :]
    w_ptrs = W + cols.to(tl.int64)[None, :] * K + (k_lo + ks)[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _k in range(k_lo, k_hi, BLOCK_K):
        a = tl.load(x_ptrs, mask=row_live[:, None], other=0.0)
        b = tl.load(w_ptrs, mask=col_in[None, :], other=0.0)
        acc = tl.dot(a, b, acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if SPLIT_K > 1:
        offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        tl.store(WS + (tile * SPLIT_K + pid_k).to(tl.int64) * (BLOCK_M * BLOCK_N) + offs, acc)
        tl.debug_barrier()
        arrived = tl.atomic_add(LOCK + tile, 1, sem="acq_rel")
        if arrived != SPLIT_K - 1:
            return
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for s in tl.static_range(SPLIT_K):
            acc += tl.load(WS + (tile * SPLIT_K + s).to(tl.int64) * (BLOCK_M * BLOCK_N) + offs, cache_modifier=".cg")
        tl.atomic_xchg(LOCK + tile, 0)
    acc += tl.load(Bias + cols, mask=col_in, other=0.0).to(tl.float32)[None, :]
    if activation == 1:
        acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
    keep = row_live[:, None] & col_in[None, :]
    if has_res != 0:
        acc += tl.load(Res + rows.to(tl.int64)[:, None] * N + cols[None, :], mask=keep, other=0.0).to(tl.float32)
    acc = tl.where(keep, acc, 0.0)
    tl.store(y_ptrs, acc.to(Y.dtype.element_ty), mask=(rows < T)[:, None] & col_in[None, :])


def _time(fn: Any, y: torch.Tensor, want: torch.Tensor | None) -> dict[str, Any]:
    try:
        if want is not None:
            y.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            err = (y.float() - want).abs().max().item()
            if not err < 0.05:
                return {"error": f"wrong result: max abs err {err}"}
            fn()  # the counters must be back at 0: a second call gives the same result
            torch.cuda.synchronize()
            err2 = (y.float() - want).abs().max().item()
            if err2 != err:
                return {"error": f"second call differs: {err} then {err2}"}
        return {"gpu_us": graph_time_us(fn, inner=10, reps=7)[0]}
    except Exception as exc:  # noqa: BLE001 - recorded
        return {"error": repr(exc)[:300]}


def _case(shape: str, T: int, live: int, quick: bool) -> list[dict[str, Any]]:
    c = GemmCase.make(shape, T, live, SHAPES[shape])
    x, w, b, res, cu, want, y = c.x, c.w, c.b, c.res, c.cu, c.want, c.y
    K, N, act, has_res, dev = c.K, c.N, c.act, c.has_res, c.x.device
    xl = x[:live].contiguous()
    base = {"shape": shape, "T": T, "live": live, "K": K, "N": N}
    recs = []

    def peer(xx: torch.Tensor) -> Any:
        def fn() -> None:
            z = F.linear(xx, w, b)
            if act:
                F.gelu(z)

        return fn

    for impl, fn in (("cublas_capacity", peer(x)), ("cublas_live", peer(xl))):
        recs.append({**base, "impl": impl, **_time(fn, y, None)})
    cfg = linear_config(T, N, 90, tma=False)  # the pointer kernel this probe times
    grid = (triton.cdiv(T, cfg.block_m) * triton.cdiv(N, cfg.block_n),)

    def shipped() -> None:
        _ragged_linear[grid](x, w, b, res, cu, y, T, N, K, 1, 1, int(has_res), 1, act, BLOCK_M=cfg.block_m,
                             BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
                             num_warps=cfg.num_warps, num_stages=cfg.num_stages)  # fmt: skip

    recs.append({**base, "impl": "shipped", "config": str(cfg), **_time(shipped, y, want)})
    if T >= 1024:
        configs = [(bm, bn, bk, nw, ns, s) for bm, bn, bk, nw, ns in LARGE_TILES for s in SPLITS[K][:2]]
    else:
        configs = [(bm, bn, bk, 4, 4 if bk == 64 else 3, s) for bm, bn, bk in TILES for s in SPLITS[K]]
    if quick:
        configs = configs[:4]
    for bm, bn, bk, nw, ns, s in configs:
        if s > 1 and K // bk < 2 * s:
            continue  # fewer than two K steps per slice
        tiles = triton.cdiv(T, bm) * triton.cdiv(N, bn)
        ws = torch.empty(tiles * s * bm * bn if s > 1 else 1, device=dev, dtype=torch.float32)
        lock = torch.zeros(tiles, device=dev, dtype=torch.int32)

        meta = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=s, GROUP_M=8, num_warps=nw, num_stages=ns)

        def sk(g: tuple[int, int] = (tiles, s), a: tuple = (ws, lock), m: dict = meta) -> None:  # noqa: B006
            _sk_linear[g](x, w, b, res, cu, y, a[0], a[1], T, N, K, 1, int(has_res), act, **m)

        recs.append({**base, "impl": f"sk_{bm}x{bn}x{bk}_w{nw}_s{ns}_k{s}", **_time(sk, y, want)})
    return recs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    args = ap.parse_args()
    path = probe_result_path(args.out, "linear_small")
    torch.manual_seed(0)
    records: list[dict[str, Any]] = []
    data = {"benchmark": "linear_small", "env": environment(), "live_fractions": LIVE, "records": records}
    for B in map(int, args.batches.split(",")):
        T = B * TOKENS
        for shape in SHAPES:
            for frac in LIVE:
                live = max(1, round(frac * T))
                recs = _case(shape, T, live, args.quick)
                records += recs
                ok = {r["impl"]: r["gpu_us"] for r in recs if "gpu_us" in r}
                best = sorted((v, k) for k, v in ok.items() if k.startswith("sk_"))[:3]
                errs = [r["impl"] + ": " + r["error"][:80] for r in recs if "error" in r]
                print(
                    f"{shape} T={T} live={live}: cublas cap={ok.get('cublas_capacity', 0):.1f} "
                    f"live={ok.get('cublas_live', 0):.1f} shipped={ok.get('shipped', 0):.1f} | best "
                    + " ".join(f"{k}={v:.1f}" for v, k in best)
                    + f" | {len(errs)} errors {errs[:2]}",
                    flush=True,
                )
                path.write_text(json.dumps(data, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
