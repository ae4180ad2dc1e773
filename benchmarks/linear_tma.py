"""Probe: can a Triton GEMM with Hopper's tensor-memory accelerator (TMA) match cuBLAS on deit_base's block GEMMs
while skipping the dead rows of the capacity layout?

    python3 -m benchmarks.linear_tma [--out benchmarks/results]

`benchmarks.linear_tune` showed the shipped ragged linear kernel (pointer loads, cp.async) at 0.55-0.75x cuBLAS on
full rows. This probe times a TMA variant with host-side tensor descriptors (triton.tools.tensor_descriptor) in
four launch styles: one program per tile, persistent (one program per SM, tiles strided), persistent with the tile
and K loops flattened, and flattened with warp specialisation. Tiles wholly past the live count cu[B] skip the
K loop and store zeros; rows past it inside a live tile are zeroed in the epilogue (the RaggedLinear contract).
Epilogue: bias, GELU (erf), residual, as `_ragged_linear`. Peers: F.linear alone and with the separate epilogue.
A probe: the kernel lives only in this file (the AOT build and the ORT op do not use it). Writes
linear_tma_<date>_<gpu>.json.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
import triton
import triton.language as tl

from benchmarks._gemm_case import BLOCK_GEMMS, GemmCase, time_impls
from benchmarks.env import environment, probe_result_path

ROWS = ((25216, 25216), (25216, 12608), (197, 197))  # (T capacity, live rows)
CONFIGS = ((128, 256, 64, 8, 3), (128, 128, 64, 8, 4), (128, 128, 64, 4, 4))
STYLES = ("tiles", "persistent", "flatten", "flatten_ws")


@triton.jit
def _epilogue(acc, Bias, Res, rows, cols, live, N, has_res, activation):
    acc += tl.load(Bias + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    if activation == 1:
        acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
    keep = (rows[:, None] < live) & (cols[None, :] < N)
    if has_res != 0:
        acc += tl.load(Res + rows.to(tl.int64)[:, None] * N + cols[None, :], mask=keep, other=0.0).to(tl.float32)
    return tl.where(keep, acc, 0.0)


@triton.jit
def _tile_of(tile, num_n, num_m, GROUP_M: tl.constexpr):
    group = GROUP_M * num_n
    first_m = (tile // group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (tile % group) % size_m, (tile % group) // size_m


@triton.jit
def _tma_linear(x_desc, w_desc, y_desc, Bias, Res, CU, T, N, K, B, has_res, activation, NUM_PROGRAMS,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                PERSISTENT: tl.constexpr, FLATTEN: tl.constexpr, WS: tl.constexpr):  # fmt: skip
    live = tl.minimum(tl.maximum(tl.load(CU + B), 0), T).to(tl.int32)
    num_n = tl.cdiv(N, BLOCK_N)
    live_m = tl.cdiv(live, BLOCK_M)
    all_m = tl.cdiv(T, BLOCK_M)
    pid = tl.program_id(0)
    if PERSISTENT:
        live_tiles = live_m * num_n
        for tile in tl.range(pid, live_tiles, NUM_PROGRAMS, flatten=FLATTEN, warp_specialize=WS):
            pid_m, pid_n = _tile_of(tile, num_n, live_m, GROUP_M)
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k in range(0, K, BLOCK_K):
                a = x_desc.load([pid_m * BLOCK_M, k])
                b = w_desc.load([pid_n * BLOCK_N, k])
                acc = tl.dot(a, b.T, acc)
            rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            acc = _epilogue(acc, Bias, Res, rows, cols, live, N, has_res, activation)
            y_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(tl.float16))
        for tile in range(live_tiles + pid, all_m * num_n, NUM_PROGRAMS):  # dead tiles: zeros
            y_desc.store([(tile // num_n) * BLOCK_M, (tile % num_n) * BLOCK_N],
                         tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float16))  # fmt: skip
    else:
        pid_m, pid_n = _tile_of(pid, num_n, all_m, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if pid_m < live_m:
            for k in range(0, K, BLOCK_K):
                a = x_desc.load([pid_m * BLOCK_M, k])
                b = w_desc.load([pid_n * BLOCK_N, k])
                acc = tl.dot(a, b.T, acc)
            rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            acc = _epilogue(acc, Bias, Res, rows, cols, live, N, has_res, activation)
        y_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(tl.float16))


def _case(name: str, T: int, live: int) -> list[dict[str, Any]]:
    from triton.tools.tensor_descriptor import TensorDescriptor

    c = GemmCase.make(name, T, live)
    sms = torch.cuda.get_device_properties(c.x.device).multi_processor_count
    fns = c.peers()
    for bm, bn, bk, nw, ns in CONFIGS:
        xd = TensorDescriptor.from_tensor(c.x, [bm, bk])
        wd = TensorDescriptor.from_tensor(c.w, [bn, bk])
        yd = TensorDescriptor.from_tensor(c.y, [bm, bn])
        tiles = triton.cdiv(T, bm) * triton.cdiv(c.N, bn)
        for style in STYLES:
            persistent = style != "tiles"
            progs = min(sms, tiles) if persistent else tiles
            flat, ws = style.startswith("flatten"), style == "flatten_ws"
            meta = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, PERSISTENT=persistent, FLATTEN=flat, WS=ws,
                        num_warps=nw, num_stages=ns)  # fmt: skip
            args = (xd, wd, yd, c.b, c.res, c.cu, T, c.N, c.K, 1, int(c.has_res), c.act, progs)
            fns[f"tma_{style}_{bm}x{bn}x{bk}_w{nw}_s{ns}"] = lambda p=progs, a=args, m=meta: _tma_linear[(p,)](*a, **m)
    return time_impls(c, fns, {"shape": name, "T": T, "live": live, "K": c.K, "N": c.N}, "tflops_live", live)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    path = probe_result_path(args.out, "linear_tma")
    torch.manual_seed(0)
    records: list[dict[str, Any]] = []
    data = {"benchmark": "linear_tma", "env": environment(), "records": records}
    for name in BLOCK_GEMMS:
        for T, live in ROWS:
            recs = _case(name, T, live)
            records += recs
            ok = [r for r in recs if "gpu_us" in r]
            peers = {r["impl"]: r["gpu_us"] for r in ok if r["impl"].startswith("cublas")}
            best = sorted((r for r in ok if not r["impl"].startswith("cublas")), key=lambda r: r["gpu_us"])[:3]
            errs = sum(1 for r in recs if "error" in r)
            line = " ".join(f"{r['impl']}={r['gpu_us']:.1f}" for r in best)
            cub, unf = peers.get("cublas_gemm", 0), peers.get("cublas_unfused", 0)
            head = f"{name} T={T} live={live}: cublas={cub:.1f} unfused={unf:.1f}"
            print(f"{head} | best {line} us ({errs} errors)", flush=True)
            path.write_text(json.dumps(data, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
