"""Probe: launch configs of the two small per-row kernels of a cls-mass capacity export, `_gather_layer_norm`
(`raggedvit/kernels/_norm_kernel.py`) and `_ragged_cls_attn` (`raggedvit/kernels/_kernel.py`).

    python3 -m benchmarks.norm_cls_tune [--out benchmarks/results]

Why: in serving run21 (`serving_2026-12-03_NVIDIA-H200_run21_linsplit.json`, dead-row blocks) the cls kernel took
~33 us a call at B=128 on deit_base and on deit_small alike (it reads ~19 / 38 MB there), and GatherLayerNorm
12.8 us a call on deit_small B=128 (~31 MB over four passes at the mean live fraction). Both launch one short
program per 4 (or 2) rows whose loads wait on a chain of dependent loads (CU, then the index or the sequence's
first row); larger programs keep more bytes in flight per chain.

Cases: the capacity layout of B = 1, 32, 128 images of 197 rows, a fraction of them live (the sample photos'
cls-mass means at each stage's input), deit_small (D = 384, H = 6) and deit_base (D = 768, H = 12), fp16. Each
config's output is checked against the shipped config's (max |diff| over the live rows; dead cls rows must be 0)
before it is timed (CUDA-graph replays, benchmarks.kernel.graph_time_us). Writes norm_cls_tune_<date>_<gpu>.json.
The cls configs run with 1024 // BLOCK_D heads a tile (the kernel's only head count when this probe ran;
benchmarks.cls_heads varies it).
"""

from __future__ import annotations

import argparse
import json
from typing import Any, NamedTuple

import torch

from benchmarks.env import environment, probe_result_path
from benchmarks.kernel import graph_time_us
from raggedvit.kernels._config import KernelConfig, pick_config
from raggedvit.kernels._launch import _launch_triton, scale_bits
from raggedvit.kernels._norm_kernel import NormConfig, norm_config
from raggedvit.kernels.gather_layer_norm import _launch_gather_layer_norm

MODELS = {"deit_small": (384, 6), "deit_base": (768, 12)}  # D, H
BATCHES = (1, 32, 128)
TOKENS = 197
LIVE = (1.0, 0.4)  # live fraction of the capacity (a stage input: all live, then ~40%)
CLS_CONFIGS = ((1, 1), (1, 2), (2, 2), (2, 4), (4, 4), (4, 8), (8, 4), (8, 8), (16, 8))  # (cls_block_n, warps)
NORM_CONFIGS = [(r, w) for r in (2, 4, 8, 16, 32) for w in (2, 4, 8)]  # (block_r, num_warps)


def _cu(B: int, frac: float, gen: torch.Generator) -> torch.Tensor:
    """[B+1] int64 on the GPU: per-image lengths around frac * 197 (at least the class row), packed from row 0."""
    mean = max(1.0, frac * TOKENS)
    lo, hi = max(1, int(mean * 0.6)), min(TOKENS, max(2, int(mean * 1.4)))
    n = torch.randint(lo, hi + 1, (B,), generator=gen) if frac < 1.0 else torch.full((B,), TOKENS)
    return torch.cat([torch.zeros(1, dtype=torch.int64), n.cumsum(0)]).cuda()


class ClsInputs(NamedTuple):
    """A cls kernel case: qkv [T, 3 D] fp16 and cu [B+1] on the GPU, the forward's Lse and the shipped config's
    cls_attn (`ref`), the shipped config `base` (pick_config), H heads of head_dim, the softmax scale, live rows."""

    qkv: torch.Tensor
    cu: torch.Tensor
    lse: torch.Tensor
    ref: torch.Tensor
    base: KernelConfig
    T: int
    B: int
    H: int
    head_dim: int
    scale: float
    live: int


def cls_inputs(model: str, B: int, frac: float, gen: torch.Generator) -> ClsInputs:
    """The capacity layout of B images of 197 rows, `frac` of them live, for MODELS[model] (draws cu, then qkv)."""
    D, H = MODELS[model]
    T = B * TOKENS
    cu = _cu(B, frac, gen)
    qkv = (torch.randn(T, 3 * D, generator=gen) * 2).to(torch.float16).cuda()
    base = pick_config(T, D // H, torch.float16)
    scale = (D // H) ** -0.5
    t_pad = -(-T // 4) * 4
    _, ref = _launch_triton(qkv, cu, H, scale, True, config=base)
    lse = torch.empty(0, dtype=torch.float32, device="cuda").set_(ref.untyped_storage(), t_pad, (H * T,))
    return ClsInputs(qkv, cu, lse, ref, base, T, B, H, D // H, scale, int(cu[-1]))


def launch_cls(c: ClsInputs, out: torch.Tensor, block_n: int, num_warps: int, heads: int) -> None:
    """`_kernel._ragged_cls_attn` over case `c` into out [T] with BLOCK_N = block_n and HG = heads."""
    from raggedvit.kernels import _kernel

    pos = c.lse  # PosTable: never read (HAS_POS off)
    _kernel._ragged_cls_attn[(-(-c.T // block_n),)](
        c.qkv, c.qkv, c.cu, c.lse, out, pos, c.cu, c.T, c.B, c.H, c.head_dim, scale_bits(c.scale), 0, 0, 0, 0,
        BLOCK_N=block_n, BLOCK_D=c.base.block_d, HAS_POS=False, HG=heads, num_warps=num_warps, num_stages=1,
    )  # fmt: skip


def _cls_case(model: str, B: int, frac: float, gen: torch.Generator) -> list[dict[str, Any]]:
    c = cls_inputs(model, B, frac, gen)
    T, live, base = c.T, c.live, c.base
    out: list[dict[str, Any]] = []
    for bn, warps in CLS_CONFIGS:
        cls = torch.full((T,), float("nan"), dtype=torch.float32, device="cuda")

        def call(bn: int = bn, warps: int = warps, cls: torch.Tensor = cls) -> None:
            launch_cls(c, cls, bn, warps, 1024 // base.block_d)

        call()
        torch.cuda.synchronize()
        err = float((cls[:live] - c.ref[:live]).abs().max()) if live else 0.0
        dead_ok = bool((cls[live:] == 0).all())
        us, note = graph_time_us(call)
        rec = {"kernel": "cls_attn", "model": model, "B": B, "T": T, "live": live, "block_n": bn, "num_warps": warps,
               "shipped": (bn, warps) == (base.cls_block_n, base.cls_num_warps), "max_abs_diff": err,
               "dead_rows_zero": dead_ok, "gpu_us": us, "note": note}  # fmt: skip
        out.append(rec)
        print(f"cls  {model:10s} B={B:3d} live={live:6d} bn={bn:2d} w={warps} {us:7.2f} us  err={err:.1e} "
              f"dead0={dead_ok}{'  (shipped)' if rec['shipped'] else ''}", flush=True)  # fmt: skip
    return out


def _norm_case(model: str, B: int, frac: float, gen: torch.Generator) -> list[dict[str, Any]]:
    D, _ = MODELS[model]
    R = B * TOKENS
    cu = _cu(B, frac, gen)
    live = int(cu[-1])
    x = torch.randn(R, D, generator=gen).to(torch.float16).cuda()
    skip = torch.randn(R, D, generator=gen).to(torch.float16).cuda()
    gamma = (1 + 0.1 * torch.randn(D, generator=gen)).to(torch.float16).cuda()
    beta = (0.1 * torch.randn(D, generator=gen)).to(torch.float16).cuda()
    index = torch.arange(R, dtype=torch.int64, device="cuda")  # norm2's identity index (norm1's is a gather)
    shipped = norm_config(D)
    assert shipped is not None
    ref_n, ref_s = _launch_gather_layer_norm(x, index, gamma, beta, skip, None, 1e-6, cu_seqlens=cu)
    out: list[dict[str, Any]] = []
    for block_r, warps in NORM_CONFIGS:
        if block_r * shipped.block_d > 32768:
            continue
        cfg = NormConfig(block_r, shipped.block_d, warps)
        bufs = (torch.empty_like(ref_n), torch.empty_like(ref_s))

        def call(cfg: NormConfig = cfg, bufs: tuple[torch.Tensor, torch.Tensor] = bufs) -> None:
            _launch_gather_layer_norm(x, index, gamma, beta, skip, None, 1e-6, cu_seqlens=cu, config=cfg, out=bufs)

        call()
        torch.cuda.synchronize()
        err = float(max((bufs[0][:live] - ref_n[:live]).abs().max(), (bufs[1][:live] - ref_s[:live]).abs().max()))
        us, note = graph_time_us(call)
        rec = {"kernel": "gather_layer_norm", "model": model, "B": B, "R": R, "live": live, "block_r": block_r,
               "block_d": shipped.block_d, "num_warps": warps, "shipped": cfg == shipped, "max_abs_diff": err,
               "gpu_us": us, "note": note}  # fmt: skip
        out.append(rec)
        print(f"norm {model:10s} B={B:3d} live={live:6d} r={block_r:2d} w={warps} {us:7.2f} us  err={err:.1e}"
              f"{'  (shipped)' if rec['shipped'] else ''}", flush=True)  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--kernels", default="cls,norm", help="comma list of cls, norm")
    args = ap.parse_args(argv)
    gen = torch.Generator().manual_seed(0)
    records: list[dict[str, Any]] = []
    kinds = args.kernels.split(",")
    for model in MODELS:
        for B in BATCHES:
            for frac in LIVE:
                if B == 1 and frac < 1.0:
                    continue
                if "cls" in kinds:
                    records += _cls_case(model, B, frac, gen)
                if "norm" in kinds:
                    records += _norm_case(model, B, frac, gen)
    path = probe_result_path(args.out, "norm_cls_tune")
    path.write_text(json.dumps({"benchmark": "norm_cls_tune", "env": environment(), "records": records}, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
