"""Probe: the ragged attention forward kernel over launch configs, against torch SDPA on the padded batch.

    python3 -m benchmarks.attn_tiles [--out benchmarks/results]

History: the serving profile (benchmarks/results/serving_2026-12-01_NVIDIA-H200_run4.json) had the kernel at 1.7x
cudnn's flash attention at deit_base B=128, when its query tiles were BLOCK_M consecutive packed rows that could
straddle sequences. This probe first held a prototype of query tiles owned by one sequence
(attn_tiles_2026-12-01_NVIDIA-H200.json, commit 21bfc02: rows "per-seq"); that design became the shipped kernel (its
tiles found by a scan of CU, later taken straight from the grid: benchmarks/attn_variants.py), so the probe times
the shipped kernel only.

Times (CUDA-graph replays, benchmarks.kernel.graph_time_us) at deit's shapes (H=12, D=64, fp16, qkv bias):
B = 1, 4, 32, 128 at L = 197 and 99 (uniform), and cls-mass-like ragged lengths; the shipped kernel with its config
(`pick_config`) and over other configs (checked against the shipped config first), and torch SDPA on the padded
batch (cudnn / flash). Writes attn_tiles_<date>_<gpu>.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.env import environment, probe_result_path
from benchmarks.kernel import graph_time_us
from raggedvit.kernels._config import pick_config
from raggedvit.kernels._launch import _launch_triton

H, D = 12, 64
# (BLOCK_M, BLOCK_N, num_warps, num_stages)
SHIPPED_VARIANTS = ((32, 64, 4, 3), (64, 32, 4, 3), (64, 64, 4, 3), (64, 64, 4, 2), (64, 128, 4, 2), (128, 64, 8, 3))


def _lengths(B: int, kind: str, gen: torch.Generator) -> list[int]:
    if kind == "ragged":  # cls-mass-like: 45% .. 14% of 196 patches kept, + the class token
        return (torch.randint(20, 120, (B,), generator=gen) + 1).tolist()
    return [int(kind)] * B


Candidate = tuple[str, Callable[[], Any], Any, "torch.Tensor | None"]  # impl, call, config, its output (checked)


def time_case(
    B: int, kind: str, candidates: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], list[Candidate]]
) -> list[dict[str, Any]]:
    """Records of one (B, lengths kind) case: qkv [T, 3*H*D] fp16, bias [3*H*D], cu [B+1] int64 drawn from a seed of
    (B, kind); `candidates(qkv, bias, cu, ref)` (ref = the shipped kernel's output) lists the calls to time, each
    checked against ref first when it names its output; then torch SDPA on the padded batch (cudnn, flash) for
    uniform lengths. Errors (e.g. out of shared memory) are recorded, not raised."""
    gen = torch.Generator().manual_seed(B * 31 + len(kind))
    lengths = _lengths(B, kind, gen)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64, device="cuda")
    T = int(cu[-1])
    qkv = torch.randn(T, 3 * H * D, generator=gen).to(torch.float16).cuda()
    bias = (torch.randn(3 * H * D, generator=gen) * 0.1).to(torch.float16).cuda()
    ref, _ = _launch_triton(qkv, cu, H, D**-0.5, False, bias=bias)
    recs: list[dict[str, Any]] = []

    def add(impl: str, fn: Callable[[], Any], cfg: Any, out: torch.Tensor | None) -> None:
        rec = {"B": B, "lengths": kind, "T": T, "impl": impl, "config": cfg}
        try:
            if out is not None:
                fn()
                rec["max_abs_diff"] = float((out.float() - ref.float()).abs().max())
            rec["gpu_us"] = graph_time_us(fn, inner=20, reps=9)[0]
        except Exception as exc:  # noqa: BLE001 - recorded (e.g. out of shared memory)
            rec["error"] = repr(exc)[:200]
        recs.append(rec)

    for impl, fn, cfg, out in candidates(qkv, bias, cu, ref):
        add(impl, fn, cfg, out)
    if kind != "ragged":
        L = lengths[0]
        q, k, v = (qkv + bias).view(B, L, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        for name, backend in (("sdpa-cudnn", "CUDNN_ATTENTION"), ("sdpa-flash", "FLASH_ATTENTION")):
            from torch.nn.attention import SDPBackend, sdpa_kernel

            def sdpa(backend=backend) -> None:
                with sdpa_kernel(getattr(SDPBackend, backend)):
                    F.scaled_dot_product_attention(q, k, v)

            add(name, sdpa, None, None)
    return recs


def _shipped_configs(qkv, bias, cu, ref) -> list[Candidate]:
    """The shipped kernel with its config, then over SHIPPED_VARIANTS."""
    scale = D**-0.5
    shipped = pick_config(qkv.shape[0], D, torch.float16)
    cfg0 = (shipped.block_m, shipped.block_n, shipped.num_warps, shipped.num_stages)
    out: list[Candidate] = [("shipped", lambda: _launch_triton(qkv, cu, H, scale, False, bias=bias), cfg0, None)]
    for bm, bn, w, st in SHIPPED_VARIANTS:
        cfg = dataclasses.replace(shipped, block_m=bm, block_n=bn, num_warps=w, num_stages=st)
        y = torch.empty_like(ref)
        out.append(("shipped-kernel", lambda cfg=cfg, y=y: _launch_triton(qkv, cu, H, scale, False, bias=bias,
                    config=cfg, out=y), (bm, bn, w, st), y))  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    path = probe_result_path(args.out, "attn_tiles")
    records: list[dict[str, Any]] = []
    data = {"benchmark": "attn_tiles", "env": environment(), "H": H, "D": D, "records": records}
    for kind in ("197", "99", "ragged"):
        for B in (1, 4, 32, 128):
            recs = time_case(B, kind, _shipped_configs)
            records += recs
            cells = " ".join(
                f"{r['impl'][:8]}{r['config'] or ''}="
                + (f"{r['gpu_us']:.1f}" if "gpu_us" in r else "ERR")
                + (f"(d{r['max_abs_diff']:.0e})" if "max_abs_diff" in r else "")
                for r in recs
            )
            print(f"L={kind} B={B}: {cells}", flush=True)
            path.write_text(json.dumps(data, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
