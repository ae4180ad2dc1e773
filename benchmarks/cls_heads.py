"""Probe: RaggedAttention's cls kernel (`_kernel._ragged_cls_attn`) with fewer heads per tile.

    python3 -m benchmarks.cls_heads [--out benchmarks/results]

The kernel loads [BLOCK_N, HG, BLOCK_D] tiles; up to 18e2707 HG was 1024 // BLOCK_D head slots (16 at D = 64), so
at deit_small's H = 6 ten of the sixteen slots were masked off: registers and issue slots spent on nothing. This
probe times, JIT on the machine's Triton and CUDA-graph replays, HG = 16 / 4 / 8 (the kernel's HG constexpr; the
first run, below, substituted the kernel source's `HG` line in module copies, before HG became a parameter) over
BLOCK_N 8 and 16 at 4 warps, at deit_small (H = 6) and deit_base (H = 12), D = 64, fp16, B x 197 capacity rows
with every row live and with ~40% live (norm_cls_tune's draws). Each variant is checked against the first one's
output. Writes cls_heads_<date>_<gpu>.json.

Result (H200; cls_heads_2026-12-03_NVIDIA-H200.json): 4 heads x 16 columns is the best or within 0.5 us of it in
every case (deit_small B = 128 21.7 -> 13.1 us a call all live, deit_base 23.6 -> 18.7 us), hence `_config.py`'s
4 heads x 16 columns from SMALL_T_LIMIT rows. Small T (B = 1, 4) was not in it.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch

from benchmarks.env import environment, probe_result_path
from benchmarks.kernel import graph_time_us
from benchmarks.norm_cls_tune import MODELS, TOKENS, _cu
from raggedvit.kernels import _kernel
from raggedvit.kernels._config import pick_config
from raggedvit.kernels._launch import _launch_triton, scale_bits

HEADS = (16, 4, 8)  # the first is the reference of the others' outputs


def _case(model: str, B: int, frac: float, gen: torch.Generator) -> list[dict[str, Any]]:
    D, H = MODELS[model]
    T = B * TOKENS
    cu = _cu(B, frac, gen)
    live = int(cu[-1])
    qkv = (torch.randn(T, 3 * D, generator=gen) * 2).to(torch.float16).cuda()
    base = pick_config(T, D // H, torch.float16)
    scale = (D // H) ** -0.5
    t_pad = -(-T // 4) * 4
    _, ref = _launch_triton(qkv, cu, H, scale, True, config=base)
    lse = torch.empty(0, dtype=torch.float32, device="cuda").set_(ref.untyped_storage(), t_pad, (H * T,))
    unused = torch.zeros(1, dtype=torch.float32, device="cuda")
    out: list[dict[str, Any]] = []
    for hg in HEADS:
        for bn in (8, 16):
            cls = torch.full((T,), float("nan"), dtype=torch.float32, device="cuda")

            def call(hg: int = hg, bn: int = bn, cls: torch.Tensor = cls) -> None:
                _kernel._ragged_cls_attn[(-(-T // bn),)](
                    qkv, qkv, cu, lse, cls, unused, cu, T, B, H, D // H, scale_bits(scale), 0, 0, 0, 0,
                    BLOCK_N=bn, BLOCK_D=base.block_d, HAS_POS=False, HG=hg, num_warps=4, num_stages=1,
                )  # fmt: skip

            call()
            torch.cuda.synchronize()
            err = float((cls[:live] - ref[:live]).abs().max()) if live else 0.0
            us, note = graph_time_us(call)
            shipped = (hg, bn) == (base.cls_heads, base.cls_block_n)
            rec = {"model": model, "B": B, "T": T, "live": live, "H": H, "hg": hg, "block_n": bn, "shipped": shipped,
                   "max_abs_diff": err, "gpu_us": us, "note": note}  # fmt: skip
            out.append(rec)
            print(f"{model:10s} B={B:3d} live={live:6d} HG={hg:2d} bn={bn:2d} {us:7.2f} us err={err:.1e}"
                  f"{'  (shipped)' if shipped else ''}", flush=True)  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    path = probe_result_path(args.out, "cls_heads")
    gen = torch.Generator().manual_seed(0)
    records: list[dict[str, Any]] = []
    data = {"benchmark": "cls_heads", "env": environment(), "records": records}
    for model in MODELS:
        for B in (32, 128):
            for frac in (1.0, 0.4):
                records += _case(model, B, frac, gen)
                path.write_text(json.dumps(data, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
