"""Probe: RaggedAttention's cls kernel (`_kernel._ragged_cls_attn`) with fewer heads per tile.

    python3 -m benchmarks.cls_heads [--out benchmarks/results]

The kernel loads [BLOCK_N, HG, BLOCK_D] tiles; up to 18e2707 HG was 1024 // BLOCK_D head slots (16 at D = 64), so
at deit_small's H = 6 ten of the sixteen slots were masked off: registers and issue slots spent on nothing. This
probe times, JIT on the machine's Triton and CUDA-graph replays, HG = 16 / 4 / 8 (the kernel's HG constexpr; the
first run, below, substituted the kernel source's `HG` line in module copies, before HG became a parameter) over
BLOCK_N 8 and 16 at 4 warps, at deit_small (H = 6) and deit_base (H = 12), D = 64, fp16, B x 197 capacity rows
with every row live and with ~40% live (norm_cls_tune's draws). Each variant is checked against the shipped config's
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
from benchmarks.norm_cls_tune import MODELS, cls_inputs, launch_cls

HEADS = (16, 4, 8)  # heads per tile (16: the kernel's before 18e2707)


def _case(model: str, B: int, frac: float, gen: torch.Generator) -> list[dict[str, Any]]:
    c = cls_inputs(model, B, frac, gen)
    out: list[dict[str, Any]] = []
    for hg in HEADS:
        for bn in (8, 16):
            cls = torch.full((c.T,), float("nan"), dtype=torch.float32, device="cuda")

            def call(hg: int = hg, bn: int = bn, cls: torch.Tensor = cls) -> None:
                launch_cls(c, cls, bn, 4, hg)

            call()
            torch.cuda.synchronize()
            err = float((cls[: c.live] - c.ref[: c.live]).abs().max()) if c.live else 0.0
            us, note = graph_time_us(call)
            shipped = (hg, bn) == (c.base.cls_heads, c.base.cls_block_n)
            rec = {"model": model, "B": B, "T": c.T, "live": c.live, "H": c.H, "hg": hg, "block_n": bn,
                   "shipped": shipped, "max_abs_diff": err, "gpu_us": us, "note": note}  # fmt: skip
            out.append(rec)
            print(f"{model:10s} B={B:3d} live={c.live:6d} HG={hg:2d} bn={bn:2d} {us:7.2f} us err={err:.1e}"
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
