"""Probe: GPU time of bias + GELU (erf) over deit's fc1 outputs, raggedvit's kernel against the peers.

    python3 -m benchmarks.gelu [--out benchmarks/results]

The serving profile (serving_2026-12-01_NVIDIA-H200_run8.json) has ONNX Runtime's BiasGelu at about 600 G
elements/s and torch's / inductor's GELU at 665-710 G/s on the H200, where an fp16 read + write streams ~1,070 G/s:
erff-bound. This times, per shape (deit_base / deit_small fc1 rows at B = 1, 32, 128; 197 and 99 tokens):
- a device-to-device copy of X (the bandwidth floor);
- torch F.gelu(X) and F.gelu(X + b) (eager, torch's erf kernel);
- a Triton kernel with libdevice erf (`_erf_form`, this probe's: the formula torch and ORT use);
- raggedvit's `_bias_gelu` (`raggedvit/kernels/_linear_kernel.py`) over (BLOCK_M, BLOCK_N, num_warps);
each as CUDA-graph replays (benchmarks.kernel.graph_time_us), with max |diff| to an fp64 GELU of the fp16 sum.
Writes gelu_<date>_<gpu>.json.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from benchmarks.env import environment, probe_result_path
from benchmarks.kernel import graph_time_us
from raggedvit.kernels._linear_kernel import _bias_gelu

SHAPES = ((197, 3072), (12672, 3072), (25216, 3072), (6304, 3072), (25216, 1536), (12672, 1536))
CONFIGS = ((1, 1024, 4), (2, 1024, 4), (4, 1024, 8), (8, 512, 4), (8, 512, 8), (16, 256, 4), (4, 512, 4))


@triton.jit
def _erf_form(X, Bias, Y, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    num_n = tl.cdiv(N, BLOCK_N)
    rows = (pid // num_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = (pid % num_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    x += tl.load(Bias + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    y = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)


def _case(M: int, N: int) -> list[dict[str, Any]]:
    g = torch.Generator(device="cpu").manual_seed(M + N)
    x = (torch.randn(M, N, generator=g) * 2).half().cuda()
    b = (torch.randn(N, generator=g) * 0.5).half().cuda()
    y = torch.empty_like(x)
    s = (x.double() + b.double()).half().double()  # the fp16 sum torch's two-kernel form sees
    exact = 0.5 * s * torch.erfc(-s / 2**0.5)
    exact32 = 0.5 * (x.double() + b.double()) * torch.erfc(-(x.double() + b.double()) / 2**0.5)
    elems = M * N

    def rec(impl: str, fn, ref: torch.Tensor | None, **extra: Any) -> dict[str, Any]:
        r: dict[str, Any] = {"M": M, "N": N, "impl": impl, **extra}
        try:
            us, note = graph_time_us(fn, inner=20, reps=9)
            r.update(gpu_us=us, g_elems_per_s=elems / us / 1e3, gb_per_s=4 * elems / us / 1e3)
            if note:
                r["note"] = note
            if ref is not None:
                fn()
                torch.cuda.synchronize()
                r["max_abs_err"] = float((y.double() - ref).abs().max())
        except Exception as exc:  # noqa: BLE001 - recorded (out of resources etc.)
            r["error"] = repr(exc)[:200]
        return r

    out = [rec("copy", lambda: y.copy_(x), None)]
    out.append(rec("torch_gelu_of_sum", lambda: torch.add(x, b, out=y).copy_(F.gelu(y)), exact))
    out.append(rec("torch_gelu", lambda: F.gelu(x), None))
    for bm, bn, w in ((4, 1024, 8), (8, 512, 4)):
        grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
        out.append(rec("triton_libdevice_erf", lambda grid=grid, bm=bm, bn=bn, w=w: _erf_form[grid](
            x, b, y, M, N, BLOCK_M=bm, BLOCK_N=bn, num_warps=w), exact32, config=[bm, bn, w]))  # fmt: skip
    for bm, bn, w in CONFIGS:
        grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
        out.append(rec("raggedvit_bias_gelu", lambda grid=grid, bm=bm, bn=bn, w=w: _bias_gelu[grid](
            x, b, y, M, N, 1, BLOCK_M=bm, BLOCK_N=bn, num_warps=w), exact32, config=[bm, bn, w]))  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    path = probe_result_path(args.out, "gelu")
    records: list[dict[str, Any]] = []
    data = {"benchmark": "gelu", "env": environment(), "records": records}
    for M, N in SHAPES:
        recs = _case(M, N)
        records += recs
        cells = " ".join(
            f"{r['impl'][:14]}{r.get('config', '')}="
            + (f"{r['gpu_us']:.1f}us/{r['g_elems_per_s']:.0f}G" if "gpu_us" in r else "ERR")
            + (f"/e{r['max_abs_err']:.1e}" if "max_abs_err" in r else "")
            for r in recs
        )
        print(f"M={M} N={N}: {cells}", flush=True)
        path.write_text(json.dumps(data, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
