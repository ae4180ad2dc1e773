"""Probe: what the persistent TMA linear kernel's GELU epilogue costs, and ways to make it cheaper.

    python3 -m benchmarks.linear_gelu [--out benchmarks/results] [--batches 32,128] [--gemms fc1,fc2,proj]

`linear_aot_2026-12-03_NVIDIA-H200_geluerf.json` had fc1 (bias + GELU) at ~1.5x cuBLAS over the live rows (no
GELU there), where qkv (bias only, 3/4 of fc1's columns) matched cuBLAS. Over linear_persistent's capacity layouts
(deit_base / deit_small, the live rows after each cls-mass stage) this times, with CUDA-graph replays:

- `shipped`: `_ragged_linear_tma` as `linear_config` picks it;
- `no_act`: the shipped kernel without the GELU (a bound: what the GELU costs; checked against bias only);
- `erf`: a copy of the kernel (`_tma_variant` below) with `gelu_erf` in the epilogue (shipped up to 36232dc);
- `poly_select`: the copy with `_gelu_poly_select`: the polynomial Phi(-|x|) of `_linear_kernel.gelu_poly`, then
  x * (x < 0 ? e : 1 - e) (four instructions where gelu_poly's max(x, 0) - |x| e takes two);
- `stagger` (with --nap-ns): the `erf` copy whose programs from num_programs / 2 on (the SMs' second residents)
  sleep ~1 us before their first tile, so the two programs of an SM fall out of phase (were their K loops and
  epilogues colliding?);
- `cublas_live`: F.linear over the live rows (bias only: a floor).

Every variant with the GELU is checked against `ragged_linear_reference` over the live rows first. The variant
kernels live only here. Writes linear_gelu_<date>_<gpu>.json.

Results (H200, Triton JIT): linear_gelu_2026-12-03_NVIDIA-H200.json, at a8be7a7's kernels with --nap-ns 1000
(`shipped` there = gelu_erf, `shipped_copy` = `erf`, `poly` = `poly_select` with a uniform-grid fit of the same
polynomial): per deit_small forward at B = 128 (nine ragged blocks) fc1 took 396 us, 270 us without the GELU and
357 us with the polynomial; staggering changed nothing (399 us; fc2, proj within 1-2%).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch.nn.functional as F
import triton
import triton.language as tl

from benchmarks.linear_epilogue import _live_tiles, _tile_acc, _variant
from benchmarks.linear_persistent import draw, run_cases, time_checked
from benchmarks.linear_tma import _tile_of
from raggedvit.kernels._linear_kernel import _phi_neg_abs, gelu_erf
from raggedvit.kernels._linear_launch import _launch_linear
from raggedvit.kernels.reference import ragged_linear_reference


@triton.jit
def _gelu_poly_select(x):
    """gelu_poly's Phi(-|x|), combined as x * (x < 0 ? e : 1 - e) (the probe's first form)."""
    e = _phi_neg_abs(x)
    return x * tl.where(x < 0.0, e, 1.0 - e)


@triton.jit
def _nap(pid, ns):
    """Sleep ~ns nanoseconds (nanosleep.u32; a hint, at most 1 ms) in every thread; returns pid."""
    return tl.inline_asm_elementwise("nanosleep.u32 $2;\n\tmov.u32 $0, $1;", "=r,r,r", [pid, ns], dtype=tl.int32,
                                     is_pure=False, pack=1)  # fmt: skip


@triton.jit
def _epi(acc, Res_desc, Y_desc, Bias, N, row0, col0, has_bias, has_res, activation, WIDTH: tl.constexpr,
         POLY: tl.constexpr):  # fmt: skip
    """`_linear_kernel._tma_epilogue` with gelu_erf, or POLY: _gelu_poly_select."""
    if has_bias != 0:
        cols = col0 + tl.arange(0, WIDTH)
        acc += tl.load(Bias + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    if activation == 1:
        if POLY:
            acc = _gelu_poly_select(acc)
        else:
            acc = gelu_erf(acc)
    if has_res != 0:
        acc += Res_desc.load([row0, col0]).to(tl.float32)
    Y_desc.store([row0, col0], acc.to(Y_desc.dtype))


@triton.jit(do_not_specialize=["T", "B", "has_bias", "has_res", "has_live", "activation", "num_programs"])
def _tma_variant(
    X_desc, W_desc, Res_desc, Y_desc, Bias, CU, T, N, K, B, has_bias, has_res, has_live, activation, num_programs,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    POLY: tl.constexpr, NAP_NS: tl.constexpr,
):  # fmt: skip
    """`_ragged_linear_tma` (two epilogue slices) with gelu_erf, or POLY: _gelu_poly_select; NAP_NS > 0: the second
    half of the programs sleeps NAP_NS ns first."""
    HALF: tl.constexpr = BLOCK_N // 2
    pid = tl.program_id(0)
    if NAP_NS > 0:
        if pid >= num_programs // 2:
            pid = _nap(pid, pid * 0 + NAP_NS)
    num_m, num_n, k_tiles = _live_tiles(CU, T, N, K, B, has_live, BLOCK_M, BLOCK_N, BLOCK_K)
    for tile in tl.range(pid, num_m * num_n, num_programs, flatten=True):
        pid_m, pid_n = _tile_of(tile, num_n, num_m, GROUP_M)
        row0 = pid_m * BLOCK_M
        col0 = pid_n * BLOCK_N
        left, right = _tile_acc(X_desc, W_desc, row0, col0, k_tiles, BLOCK_M, BLOCK_N, BLOCK_K)
        _epi(left, Res_desc, Y_desc, Bias, N, row0, col0, has_bias, has_res, activation, HALF, POLY)
        _epi(right, Res_desc, Y_desc, Bias, N, row0, col0 + HALF, has_bias, has_res, activation, HALF, POLY)


def _case(model: str, gemm: str, T: int, live: int, nap_ns: int) -> list[dict[str, Any]]:
    x, w, b, res, cu, y, act, want = draw(model, gemm, T, live)
    K, N = x.shape[1], w.shape[0]
    xl = x[:live]
    base = {"model": model, "gemm": gemm, "T": T, "live": live, "K": K, "N": N}
    fns: dict[str, Callable[[], Any]] = {
        "cublas_live": lambda: F.linear(xl, w, b),
        "shipped": lambda: _launch_linear(x, w, b, res, cu, act, out=y),
    }
    if act:
        fns["poly_select"] = _variant(_tma_variant, x, w, b, res, cu, act, y, POLY=True, NAP_NS=0)
    fns["erf"] = _variant(_tma_variant, x, w, b, res, cu, act, y, POLY=False, NAP_NS=0)
    if nap_ns > 0:
        fns["stagger"] = _variant(_tma_variant, x, w, b, res, cu, act, y, POLY=False, NAP_NS=nap_ns)
    records = time_checked(fns, base, y, live, want)
    if act:  # the bound: checked against the bias-only result
        want_plain = ragged_linear_reference(xl, w, b, None if res is None else res[:live], cu, 0).float()
        records += time_checked({"no_act": lambda: _launch_linear(x, w, b, res, cu, 0, out=y)}, base, y, live,
                                want_plain)  # fmt: skip
    return records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--batches", default="32,128")
    ap.add_argument("--gemms", default="fc1,fc2,proj")
    ap.add_argument("--nap-ns", type=int, default=0, help="> 0: add the `stagger` variant (the first run: 1000)")
    args = ap.parse_args()
    run_cases("linear_gelu", lambda m, g, T, live: _case(m, g, T, live, args.nap_ns), args.batches, args.out,
              gemms=tuple(args.gemms.split(",")), per_gemm=True, meta={"nap_ns": args.nap_ns})  # fmt: skip


if __name__ == "__main__":
    main()
