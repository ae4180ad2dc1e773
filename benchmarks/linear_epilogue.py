"""Probe: where the persistent TMA ragged linear kernel (`_ragged_linear_tma`) loses to cuBLAS in its epilogue.

    python3 -m benchmarks.linear_epilogue [--out benchmarks/results] [--batches 32,128]

`linear_aot_2026-12-03_NVIDIA-H200_geluerf.json` has qkv (bias only) at 0.94-1.0x cuBLAS over the live rows, but
proj and fc2 (bias + residual) at 1.25-1.45x and fc1 (bias + GELU) at ~1.5x. The shipped epilogue loads the residual
slice through TMA when the K loop of its tile is done, so the program waits on that load before its store. This
probe times, JIT on the machine's Triton, over linear_persistent's capacity layouts (deit_base / deit_small, the
live rows after each cls-mass stage, B = 32 and 128):

- `shipped`: `_ragged_linear_tma` under `linear_config`'s pick (64 x 128 x 64, 4 warps, 4 stages, 2 per SM,
  two epilogue slices);
- `res_ptr`: the same kernel, with the residual and bias of a tile loaded by pointer (`tl.load`) before its K loop,
  so their latency hides behind it (the loads are only waited on at their first use, in the epilogue);
- `res_tma_early`: the residual's TMA loads moved before the K loop;
- `ws`: the shipped kernel with `warp_specialize=True` on its tile loop (a producer warp for the TMA loads), where
  the machine's Triton compiles it for Hopper;
- `cublas_live`: F.linear over the live rows (bias only: a floor).

Each variant is checked against `ragged_linear_reference` over the live rows before it is timed (CUDA-graph
replays). The variant kernels live only here. Writes linear_epilogue_<date>_<gpu>.json.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch.nn.functional as F
import triton
import triton.language as tl

from benchmarks.linear_persistent import draw, run_cases, time_checked
from benchmarks.linear_tma import _tile_of
from raggedvit.kernels._linear_config import linear_config
from raggedvit.kernels._linear_kernel import _tma_epilogue, gelu_erf
from raggedvit.kernels._linear_launch import _launch_linear, _multiprocessors


@triton.jit
def _live_tiles(CU, T, N, K, B, has_live, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """(row tiles up to the live count, column tiles, K tiles), as the shipped kernel counts them."""
    live = T
    if has_live != 0:
        live = tl.minimum(tl.maximum(tl.load(CU + B), 0), T).to(tl.int32)
    return tl.cdiv(live, BLOCK_M), tl.cdiv(N, BLOCK_N), tl.cdiv(K, BLOCK_K)


@triton.jit
def _tile_acc(X_desc, W_desc, row0, col0, k_tiles, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr):  # fmt: skip
    """The shipped kernel's K loop of one tile, split into its two [BLOCK_M, BLOCK_N / 2] epilogue slices."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kk in range(k_tiles):
        a = X_desc.load([row0, kk * BLOCK_K])
        b = W_desc.load([col0, kk * BLOCK_K])
        acc = tl.dot(a, b.T, acc)
    return tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))


@triton.jit
def _slice_out(acc, bias, res, has_bias, has_res, activation, Y_desc, row0, col0):
    if has_bias != 0:
        acc += bias[None, :]
    if activation == 1:
        acc = gelu_erf(acc)
    if has_res != 0:
        acc += res
    Y_desc.store([row0, col0], acc.to(Y_desc.dtype))


@triton.jit(do_not_specialize=["T", "B", "has_bias", "has_res", "has_live", "activation", "num_programs"])
def _tma_res_ptr(
    X_desc, W_desc, Res, Y_desc, Bias, CU, T, N, K, B, has_bias, has_res, has_live, activation, num_programs,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """Two epilogue slices; the residual / bias of a tile by pointer before its K loop."""
    HALF: tl.constexpr = BLOCK_N // 2
    pid = tl.program_id(0)
    num_m, num_n, k_tiles = _live_tiles(CU, T, N, K, B, has_live, BLOCK_M, BLOCK_N, BLOCK_K)
    for tile in tl.range(pid, num_m * num_n, num_programs, flatten=True):
        pid_m, pid_n = _tile_of(tile, num_n, num_m, GROUP_M)
        row0 = pid_m * BLOCK_M
        col0 = pid_n * BLOCK_N
        rows = row0 + tl.arange(0, BLOCK_M)
        c_lo = col0 + tl.arange(0, HALF)
        c_hi = c_lo + HALF
        r_ok = (rows < T)[:, None] & (has_res != 0)
        base = Res + rows.to(tl.int64)[:, None] * N
        res_lo = tl.load(base + c_lo[None, :], mask=r_ok & (c_lo < N)[None, :], other=0.0)
        res_hi = tl.load(base + c_hi[None, :], mask=r_ok & (c_hi < N)[None, :], other=0.0)
        b_lo = tl.load(Bias + c_lo, mask=(c_lo < N) & (has_bias != 0), other=0.0)
        b_hi = tl.load(Bias + c_hi, mask=(c_hi < N) & (has_bias != 0), other=0.0)
        left, right = _tile_acc(X_desc, W_desc, row0, col0, k_tiles, BLOCK_M, BLOCK_N, BLOCK_K)
        _slice_out(left, b_lo.to(tl.float32), res_lo.to(tl.float32), has_bias, has_res, activation, Y_desc, row0,
                   col0)  # fmt: skip
        _slice_out(right, b_hi.to(tl.float32), res_hi.to(tl.float32), has_bias, has_res, activation, Y_desc, row0,
                   col0 + HALF)  # fmt: skip


@triton.jit(do_not_specialize=["T", "B", "has_bias", "has_res", "has_live", "activation", "num_programs"])
def _tma_res_early(
    X_desc, W_desc, Res_desc, Y_desc, Bias, CU, T, N, K, B, has_bias, has_res, has_live, activation, num_programs,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """Two epilogue slices; the residual's TMA loads issued before the K loop."""
    HALF: tl.constexpr = BLOCK_N // 2
    pid = tl.program_id(0)
    num_m, num_n, k_tiles = _live_tiles(CU, T, N, K, B, has_live, BLOCK_M, BLOCK_N, BLOCK_K)
    for tile in tl.range(pid, num_m * num_n, num_programs, flatten=True):
        pid_m, pid_n = _tile_of(tile, num_n, num_m, GROUP_M)
        row0 = pid_m * BLOCK_M
        col0 = pid_n * BLOCK_N
        res_lo = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)
        res_hi = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)
        if has_res != 0:
            res_lo = Res_desc.load([row0, col0]).to(tl.float32)
            res_hi = Res_desc.load([row0, col0 + HALF]).to(tl.float32)
        c_lo = col0 + tl.arange(0, HALF)
        b_lo = tl.load(Bias + c_lo, mask=(c_lo < N) & (has_bias != 0), other=0.0).to(tl.float32)
        b_hi = tl.load(Bias + c_lo + HALF, mask=(c_lo + HALF < N) & (has_bias != 0), other=0.0).to(tl.float32)
        left, right = _tile_acc(X_desc, W_desc, row0, col0, k_tiles, BLOCK_M, BLOCK_N, BLOCK_K)
        _slice_out(left, b_lo, res_lo, has_bias, has_res, activation, Y_desc, row0, col0)
        _slice_out(right, b_hi, res_hi, has_bias, has_res, activation, Y_desc, row0, col0 + HALF)


@triton.jit(do_not_specialize=["T", "B", "has_bias", "has_res", "has_live", "activation", "num_programs"])
def _tma_ws(
    X_desc, W_desc, Res_desc, Y_desc, Bias, CU, T, N, K, B, has_bias, has_res, has_live, activation, num_programs,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """The shipped kernel's body with warp_specialize=True on the tile loop."""
    HALF: tl.constexpr = BLOCK_N // 2
    pid = tl.program_id(0)
    num_m, num_n, k_tiles = _live_tiles(CU, T, N, K, B, has_live, BLOCK_M, BLOCK_N, BLOCK_K)
    for tile in tl.range(pid, num_m * num_n, num_programs, flatten=True, warp_specialize=True):
        pid_m, pid_n = _tile_of(tile, num_n, num_m, GROUP_M)
        row0 = pid_m * BLOCK_M
        col0 = pid_n * BLOCK_N
        left, right = _tile_acc(X_desc, W_desc, row0, col0, k_tiles, BLOCK_M, BLOCK_N, BLOCK_K)
        _tma_epilogue(left, Res_desc, Y_desc, Bias, N, row0, col0, has_bias, has_res, activation, HALF)
        _tma_epilogue(right, Res_desc, Y_desc, Bias, N, row0, col0 + HALF, has_bias, has_res, activation, HALF)


def _variant(kernel: Any, x, w, b, res, cu, act, y, **constexprs: Any) -> Callable[[], Any]:
    """A launch of a variant kernel under the shipped tiles (two 64-column slices), as `_launch_linear` does;
    `constexprs`: the variant's own (benchmarks.linear_gelu)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    T, K = x.shape
    N = w.shape[0]
    cfg = linear_config(T, N, 90, True)
    assert cfg.tma and cfg.epilogue_split == 2, cfg
    tiles = -(-T // cfg.block_m) * -(-N // cfg.block_n)
    programs = min(cfg.programs_per_sm * _multiprocessors(x.device), tiles)
    half = cfg.block_n // 2
    x_desc = TensorDescriptor(x, [T, K], [K, 1], [cfg.block_m, cfg.block_k])
    w_desc = TensorDescriptor(w, [N, K], [K, 1], [cfg.block_n, cfg.block_k])
    y_desc = TensorDescriptor(y, [T, N], [N, 1], [cfg.block_m, half])
    r = res if res is not None else y
    res_arg = r if kernel is _tma_res_ptr else TensorDescriptor(r, [T, N], [N, 1], [cfg.block_m, half])
    B = cu.shape[0] - 1

    def call() -> None:
        kernel[(programs,)](
            x_desc, w_desc, res_arg, y_desc, b, cu, T, N, K, B, 1, int(res is not None), 1, act, programs,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, **constexprs,
        )  # fmt: skip

    return call


def _case(model: str, gemm: str, T: int, live: int) -> list[dict[str, Any]]:
    x, w, b, res, cu, y, act, want = draw(model, gemm, T, live)
    K, N = x.shape[1], w.shape[0]
    xl = x[:live]
    fns: dict[str, Callable[[], Any]] = {
        "cublas_live": lambda: F.linear(xl, w, b),
        "shipped": lambda: _launch_linear(x, w, b, res, cu, act, out=y),
    }
    for name, kern in (("res_ptr", _tma_res_ptr), ("res_tma_early", _tma_res_early), ("ws", _tma_ws)):
        try:
            fns[name] = _variant(kern, x, w, b, res, cu, act, y)
        except Exception as exc:  # noqa: BLE001 - recorded
            fns[name] = lambda exc=exc: (_ for _ in ()).throw(exc)
    base = {"model": model, "gemm": gemm, "T": T, "live": live, "K": K, "N": N}
    return time_checked(fns, base, y, live, want)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--batches", default="32,128")
    args = ap.parse_args()
    run_cases("linear_epilogue", _case, args.batches, args.out)


if __name__ == "__main__":
    main()
