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
import json
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from benchmarks.env import environment, probe_result_path
from benchmarks.kernel import graph_time_us
from benchmarks.linear_persistent import GEMMS, MODELS, TOKENS, draw
from raggedvit.kernels._linear_config import linear_config
from raggedvit.kernels._linear_kernel import _phi_neg_abs, gelu_erf
from raggedvit.kernels._linear_launch import _launch_linear, _multiprocessors
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
    nap_ns, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    POLY: tl.constexpr, STAGGER: tl.constexpr,
):  # fmt: skip
    """`_ragged_linear_tma` (two epilogue slices) with gelu_erf, or POLY: _gelu_poly_select; STAGGER: the second
    half of the programs sleeps nap_ns first."""
    pid = tl.program_id(0)
    if STAGGER:
        if pid >= num_programs // 2:
            pid = _nap(pid, nap_ns)
    live = T
    if has_live != 0:
        live = tl.minimum(tl.maximum(tl.load(CU + B), 0), T).to(tl.int32)
    num_m = tl.cdiv(live, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(pid, num_m * num_n, num_programs, flatten=True):
        first_m = (tile // group) * GROUP_M
        size_m = tl.minimum(num_m - first_m, GROUP_M)
        pid_m = first_m + (tile % group) % size_m
        pid_n = (tile % group) // size_m
        row0 = pid_m * BLOCK_M
        col0 = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kk in range(k_tiles):
            a = X_desc.load([row0, kk * BLOCK_K])
            b = W_desc.load([col0, kk * BLOCK_K])
            acc = tl.dot(a, b.T, acc)
        halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
        left, right = tl.split(halves)
        _epi(left, Res_desc, Y_desc, Bias, N, row0, col0, has_bias, has_res, activation, BLOCK_N // 2, POLY)
        _epi(right, Res_desc, Y_desc, Bias, N, row0, col0 + BLOCK_N // 2, has_bias, has_res, activation,
             BLOCK_N // 2, POLY)  # fmt: skip


def _variant(x, w, b, res, cu, act, y, poly: bool, stagger_ns: int) -> Callable[[], Any]:
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
    r_desc = TensorDescriptor(res if res is not None else y, [T, N], [N, 1], [cfg.block_m, half])
    B = cu.shape[0] - 1

    def call() -> None:
        _tma_variant[(programs,)](
            x_desc, w_desc, r_desc, y_desc, b, cu, T, N, K, B, 1, int(res is not None), 1, act, programs,
            stagger_ns, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
            POLY=poly, STAGGER=stagger_ns > 0, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip

    return call


def _case(model: str, gemm: str, T: int, live: int, nap_ns: int) -> list[dict[str, Any]]:
    x, w, b, res, cu, y, act, want = draw(model, gemm, T, live)
    K, N = x.shape[1], w.shape[0]
    xl = x[:live]
    want_plain = ragged_linear_reference(xl, w, b, None if res is None else res[:live], cu, 0).float()
    fns: dict[str, tuple[Callable[[], Any], torch.Tensor | None]] = {
        "cublas_live": (lambda: F.linear(xl, w, b), None),
        "shipped": (lambda: _launch_linear(x, w, b, res, cu, act, out=y), want),
    }
    if act:
        fns["no_act"] = (lambda: _launch_linear(x, w, b, res, cu, 0, out=y), want_plain)
        fns["poly_select"] = (_variant(x, w, b, res, cu, act, y, True, 0), want)
    fns["erf"] = (_variant(x, w, b, res, cu, act, y, False, 0), want)
    if nap_ns > 0:
        fns["stagger"] = (_variant(x, w, b, res, cu, act, y, False, nap_ns), want)
    records = []
    for impl, (fn, ref) in fns.items():
        rec: dict[str, Any] = {"model": model, "gemm": gemm, "T": T, "live": live, "K": K, "N": N, "impl": impl}
        try:
            y.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            if ref is not None:
                err = (y[:live].float() - ref).abs().max().item()
                rec["max_abs_err"] = err
                if not err < 0.05:
                    rec["error"] = f"wrong result: max abs err {err}"
                    records.append(rec)
                    continue
            rec["gpu_us"] = graph_time_us(fn, inner=10, reps=7)[0]
        except Exception as exc:  # noqa: BLE001 - recorded
            rec["error"] = repr(exc)[:400]
        records.append(rec)
    return records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--batches", default="32,128")
    ap.add_argument("--gemms", default="fc1,fc2,proj")
    ap.add_argument("--nap-ns", type=int, default=0, help="> 0: add the `stagger` variant (the first run: 1000)")
    args = ap.parse_args()
    path = probe_result_path(args.out, "linear_gelu")
    torch.manual_seed(0)
    records: list[dict[str, Any]] = []
    data = {"benchmark": "linear_gelu", "env": environment(), "models": MODELS, "nap_ns": args.nap_ns,
            "records": records}  # fmt: skip
    totals: dict[tuple[str, int], dict[str, float]] = {}
    for model, (_, fractions) in MODELS.items():
        for batch in (int(v) for v in args.batches.split(",")):
            T = batch * TOKENS
            for frac in fractions:
                live = max(1, round(frac * T))
                for gemm in args.gemms.split(","):
                    assert gemm in GEMMS, gemm
                    recs = _case(model, gemm, T, live, args.nap_ns)
                    records += recs
                    ok = {r["impl"]: r["gpu_us"] for r in recs if "gpu_us" in r}
                    tot = totals.setdefault((model, batch), {})
                    for impl, us in ok.items():
                        tot[f"{gemm}:{impl}"] = tot.get(f"{gemm}:{impl}", 0.0) + 3 * us
                    errs = {r["impl"]: r["error"][:120] for r in recs if "error" in r}
                    print(f"{model} {gemm} T={T} live={live}: { {k: round(v, 1) for k, v in ok.items()} } "
                          f"errors {errs}", flush=True)  # fmt: skip
                    path.write_text(json.dumps(data, indent=1))
    data["per_forward_us"] = [{"model": m, "batch": b, **{k: round(v, 1) for k, v in t.items()}}
                              for (m, b), t in totals.items()]  # fmt: skip
    for row in data["per_forward_us"]:
        print("per forward (9 ragged blocks):", row)
    path.write_text(json.dumps(data, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
