"""Probe: how fast can a chain of small-M block GEMMs run as one CUDA graph, with Programmatic Dependent Launch?

    python3 -m benchmarks.pdl_chain [--out benchmarks/results] [--quick]

At B = 1 and 4 a forward is ~110-130 kernels of 2-7 us each (serving run27: deit_base topk-l2 B=1 417 us of GPU
time, ~260 us of it cuBLAS: the 48 block GEMMs on 99-197 rows, their split-K reductions and the head, against a 36
us floor to read the fp16 weights). Each GEMM there is latency-bound: launch, the first K tiles' trip to HBM, a
short K loop, the epilogue and the tail of the last programs. Hopper's Programmatic Dependent Launch lets a kernel's
programs start while the kernel before it is still running and wait (`griddepcontrol.wait`) only before they read
its output; what they do before the wait, e.g. pulling their weight tiles into L2, overlaps the previous kernel.

This probe times deit's block GEMMs as a dependent chain, 12 blocks x (qkv -> proj on qkv's first D columns -> fc1
with GELU -> fc2), captured in one CUDA graph, at M = 197 / 99 rows (B = 1 before / after topk-l2 0.5@4) and 788 /
396 (B = 4), for deit_base (D = 768) and deit_small (D = 384):

- `cublas`: torch.addmm (cuBLAS) per GEMM and F.gelu after fc1 (two kernels, like the exports' MatMul + BiasGelu);
- `triton`: one Triton kernel per GEMM (bias, and GELU in fc1's epilogue), plain launches;
- `triton_pdl`: the same kernel launched with PDL: each program waits on the previous grid, then lets the next one
  launch;
- `triton_pdl_prefetch`: and before the wait, each program prefetches its weight tile (all K) into L2;
- `triton_pdl_late`, `triton_pdl_late_prefetch`: as the two above, but the next grid is released only after the
  program's K loop;
- `empty` / `empty_pdl`: 48 launches of a kernel that does nothing (the graph's launch cost per node).

The kernels live only in this file. The first block's four outputs of every Triton variant are checked against
F.linear (+ GELU) before timing. Writes pdl_chain_<date>_<gpu>.json: us per chain and per GEMM for each (model, M,
variant, tile rule `tiles`, K tile), and the best Triton forward estimate of a B = 1 / 4 topk-l2 forward's 48 GEMMs
(4 blocks at 197 / 788 rows, 8 at 99 / 396) against cuBLAS's.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from benchmarks.env import environment, probe_result_path
from benchmarks.kernel import graph_time_us

BLOCKS = 12
MODELS = {"deit_base": 768, "deit_small": 384}
ROWS = (197, 99, 788, 396)


@triton.jit
def _gdc_wait():
    # griddepcontrol.wait: a no-op unless the grid was launched with PDL (same asm as triton.language.extra.cuda)
    tl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _gdc_launch_dependents():
    tl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=tl.int32, is_pure=False,
                              pack=1)  # fmt: skip


@triton.jit
def _chain_linear(X, W, Bias, Y, M, N, K, stride_xm, stride_ym,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GELU: tl.constexpr,
                  PDL: tl.constexpr, PREFETCH: tl.constexpr, LATE: tl.constexpr):  # fmt: skip
    """Y[M, N] = X[M, K] @ W[N, K]^T + Bias (GELU if set); N % BLOCK_N == 0, K % BLOCK_K == 0. Programs walk the N
    tiles of one row tile first. PDL: wait on the previous grid before reading X, then let the next grid launch (LATE:
    only after the K loop, so that its programs do not take SM slots from this grid's later ones); PREFETCH: before
    that wait, prefetch this program's W rows (all of K) into L2, one 128-byte line per 64 fp16."""
    pid = tl.program_id(0)
    num_n = N // BLOCK_N
    pid_m = pid // num_n
    pid_n = pid % num_n
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    if PREFETCH:
        lines = W + rn.to(tl.int64) * K
        for k0 in range(0, K, 64):
            tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0;", "=r,l",
                                      [lines + k0], dtype=tl.int32, is_pure=False, pack=1)  # fmt: skip
    if PDL:
        _gdc_wait()
        if not LATE:
            _gdc_launch_dependents()
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_in = rm < M
    x_ptrs = X + rm.to(tl.int64)[:, None] * stride_xm + rk[None, :]
    w_ptrs = W + rn.to(tl.int64)[None, :] * K + rk[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, K, BLOCK_K):
        a = tl.load(x_ptrs, mask=row_in[:, None], other=0.0)
        b = tl.load(w_ptrs)
        acc = tl.dot(a, b, acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if PDL and LATE:
        _gdc_launch_dependents()
    acc += tl.load(Bias + rn).to(tl.float32)[None, :]
    if GELU:
        acc = 0.5 * acc * (1.0 + tl.erf(acc * 0.7071067811865476))
    y_ptrs = Y + rm.to(tl.int64)[:, None] * stride_ym + rn[None, :]
    tl.store(y_ptrs, acc.to(Y.dtype.element_ty), mask=row_in[:, None])


@triton.jit
def _empty(X, PDL: tl.constexpr):
    if PDL:
        _gdc_wait()
        _gdc_launch_dependents()


def tiles(M: int, N: int, rule: str, sms: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) of one GEMM: "64x64" fixed; "narrow32": 32 x 32 when N <= 1024 and M <= 400 (deit's proj
    and fc2 at B = 1: few 64 x 64 tiles), 64 x 64 otherwise; or "fill": the largest of 64x64, 32x64, 64x32, 32x32,
    16x32 whose grid reaches the SM count (else the last)."""
    if rule == "64x64":
        return 64, 64
    if rule == "narrow32":
        return (32, 32) if N <= 1024 and M <= 400 else (64, 64)
    cands = ((64, 64), (32, 64), (64, 32), (32, 32), (16, 32))
    for bm, bn in cands:
        if triton.cdiv(M, bm) * (N // bn) >= sms:
            return bm, bn
    return cands[-1]


@dataclass(frozen=True)
class Variant:
    name: str
    rule: str  # `tiles` rule
    block_k: int
    stages: int
    pdl: bool
    prefetch: bool
    late: bool


class Chain:
    """12 blocks of (qkv, proj, fc1 + GELU, fc2) weights for width D at M rows, their buffers, and the chain's calls."""

    def __init__(self, D: int, M: int, gen: torch.Generator) -> None:
        dev, dt = "cuda", torch.float16

        def lin(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
            w = (torch.randn(n, k, generator=gen) / k**0.5).to(dt).to(dev)
            return w, (torch.randn(n, generator=gen) * 0.1).to(dt).to(dev)

        self.D, self.M = D, M
        self.w = [[lin(3 * D, D), lin(D, D), lin(4 * D, D), lin(D, 4 * D)] for _ in range(BLOCKS)]
        self.x0 = torch.randn(M, D, generator=gen).to(dt).to(dev)
        self.qkv = torch.empty(M, 3 * D, dtype=dt, device=dev)
        self.p = torch.empty(M, D, dtype=dt, device=dev)
        self.h = torch.empty(M, 4 * D, dtype=dt, device=dev)
        self.y = [torch.empty(M, D, dtype=dt, device=dev) for _ in range(2)]

    def steps(self) -> list[tuple[torch.Tensor, int, torch.Tensor, torch.Tensor, torch.Tensor, bool]]:
        """(X, K of X read, W, bias, Y, gelu) of the 48 GEMMs in order; proj reads qkv's first D columns."""
        out, x = [], self.x0
        for i, ((wq, bq), (wp, bp), (w1, b1), (w2, b2)) in enumerate(self.w):
            y = self.y[i % 2]
            out += [(x, self.D, wq, bq, self.qkv, False), (self.qkv, self.D, wp, bp, self.p, False),
                    (self.p, self.D, w1, b1, self.h, True), (self.h, 4 * self.D, w2, b2, y, False)]  # fmt: skip
            x = y
        return out

    def cublas(self) -> Callable[[], None]:
        D = self.D

        def run() -> None:
            x = self.x0
            for (wq, bq), (wp, bp), (w1, b1), (w2, b2) in self.w:
                qkv = torch.addmm(bq, x, wq.t())
                p = torch.addmm(bp, qkv[:, :D], wp.t())
                h = F.gelu(torch.addmm(b1, p, w1.t()))
                x = torch.addmm(b2, h, w2.t())

        return run

    def launches(self, v: Variant, sms: int, first_block: bool = False) -> list[tuple[Any, ...]]:
        """(grid, args, meta) of the chain's Triton launches under `v` (the first block's four only if set)."""
        out = []
        for x, k, w, b, y, gelu in self.steps()[: 4 if first_block else None]:
            N = w.shape[0]
            bm, bn = tiles(self.M, N, v.rule, sms)
            meta = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=v.block_k, GELU=gelu, PDL=v.pdl, PREFETCH=v.prefetch,
                        LATE=v.late, num_warps=4, num_stages=v.stages, launch_pdl=v.pdl)  # fmt: skip
            out.append(((triton.cdiv(self.M, bm) * (N // bn),), (x, w, b, y, self.M, N, k, x.stride(0), y.stride(0)),
                        meta))  # fmt: skip
        return out

    def triton(self, v: Variant, sms: int) -> Callable[[], None]:
        launches = self.launches(v, sms)

        def run() -> None:
            for grid, args, meta in launches:
                _chain_linear[grid](*args, **meta)

        return run

    def first_block_error(self, v: Variant, sms: int) -> float:
        """Max relative error of the first block's four Triton GEMMs under `v`, each against F.linear (+ GELU) on
        the same input."""
        errs = []
        for (grid, args, meta), (x, k, w, b, y, gelu) in zip(self.launches(v, sms, True), self.steps()[:4],
                                                              strict=True):  # fmt: skip
            _chain_linear[grid](*args, **meta)
            ref = F.linear(x[:, :k], w, b)
            ref = F.gelu(ref) if gelu else ref
            torch.cuda.synchronize()
            errs.append(float((y.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-6)))
        return max(errs)


def empty_chain(pdl: bool) -> Callable[[], None]:
    buf = torch.empty(1, device="cuda")

    def run() -> None:
        for _ in range(4 * BLOCKS):
            _empty[(1,)](buf, PDL=pdl, launch_pdl=pdl)

    return run


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--quick", action="store_true", help="deit_base at M = 197 only, one tile rule")
    args = ap.parse_args(argv)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    records: list[dict[str, Any]] = []
    for pdl in (False, True):
        try:
            us, how = graph_time_us(empty_chain(pdl), inner=5)
            records.append({"variant": "empty_pdl" if pdl else "empty", "us_per_chain": us, "timing": how or "graph",
                            "us_per_launch": us / (4 * BLOCKS)})  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - recorded, not raised (e.g. a Triton without launch_pdl)
            records.append({"variant": "empty_pdl" if pdl else "empty", "error": f"{type(exc).__name__}: {exc}"})
        print(records[-1], flush=True)
    models = {"deit_base": 768} if args.quick else MODELS
    rows = (197,) if args.quick else ROWS
    rules = ("64x64",) if args.quick else ("64x64", "narrow32", "fill")
    kinds = (("triton", False, False, False), ("triton_pdl", True, False, False),
             ("triton_pdl_prefetch", True, True, False), ("triton_pdl_late", True, False, True),
             ("triton_pdl_late_prefetch", True, True, True))  # fmt: skip
    variants = [Variant(name, rule, bk, st, pdl, pf, late) for rule in rules for bk, st in ((64, 4), (128, 3))
                for name, pdl, pf, late in kinds]  # fmt: skip
    for model, D in models.items():
        for M in rows:
            chain = Chain(D, M, torch.Generator().manual_seed(D + M))
            us, how = graph_time_us(chain.cublas(), inner=3)
            base = {"model": model, "D": D, "M": M}
            records.append({**base, "variant": "cublas", "us_per_chain": us, "us_per_gemm": us / (4 * BLOCKS),
                            "timing": how or "graph"})  # fmt: skip
            print(records[-1], flush=True)
            for v in variants:
                rec = {**base, "variant": v.name, **{k: x for k, x in asdict(v).items() if k != "name"}}
                try:
                    rec["rel_err_first_block"] = chain.first_block_error(v, sms)
                    us, how = graph_time_us(chain.triton(v, sms), inner=3)
                    rec.update(us_per_chain=us, us_per_gemm=us / (4 * BLOCKS), timing=how or "graph")
                except Exception as exc:  # noqa: BLE001 - recorded, not raised
                    rec["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                records.append(rec)
                print(rec, flush=True)
    summary = estimates(records)
    for line in summary:
        print(line, flush=True)
    path = probe_result_path(args.out, "pdl_chain")
    path.write_text(json.dumps({"benchmark": "pdl_chain", "env": environment(), "records": records,
                                "estimates": summary}, indent=1))  # fmt: skip
    print(f"wrote {path}")


def estimates(records: list[dict[str, Any]]) -> list[str]:
    """A topk-l2 0.5@4 forward's 48 GEMMs: 4 blocks at the full rows and 8 at the kept rows, from the chains' us per
    block (us_per_chain / 12): cuBLAS against the best Triton variant of each (model, M)."""

    def best(model: str, M: int, prefix: str) -> dict[str, Any] | None:
        ok = [
            r
            for r in records
            if r.get("model") == model
            and r.get("M") == M
            and "us_per_chain" in r
            and r["variant"].startswith(prefix)
            and (prefix != "triton" or r.get("rel_err_first_block", 1) < 2e-2)
        ]
        return min(ok, key=lambda r: r["us_per_chain"]) if ok else None  # fmt: skip

    out = []
    for model in MODELS:
        for full, kept, b in ((197, 99, 1), (788, 396, 4)):
            parts = {}
            for prefix in ("cublas", "triton"):
                a, c = best(model, full, prefix), best(model, kept, prefix)
                if a and c:
                    parts[prefix] = (4 * a["us_per_chain"] + 8 * c["us_per_chain"]) / BLOCKS
                    parts[prefix + "_how"] = f"{a['variant']}/{a.get('rule')}/{a.get('block_k')}"
            if "cublas" in parts and "triton" in parts:
                out.append(f"{model} B={b}: 48 GEMMs {parts['cublas']:.1f} us (cuBLAS) vs {parts['triton']:.1f} us "
                           f"(best Triton: {parts['triton_how']})")  # fmt: skip
    return out


if __name__ == "__main__":
    main()
