"""Probe: query tiles that straddle sequences (the shipped `_ragged_attn_fwd`) against tiles owned by one sequence.

    python3 -m benchmarks.attn_tiles [--out benchmarks/results]

The H200 serving profile (benchmarks/results/serving_2026-12-01_NVIDIA-H200_run4.json) had the shipped kernel at
1.7x cudnn's flash attention at deit_base B=128 (150 vs 87 us a call). The shipped kernel's query tile owns
BLOCK_M consecutive packed rows: a tile across an image boundary runs the keys of both images with half of them
masked, and every row binary-searches CU. The prototype here (`_attn_per_seq`, no position bias) gives each program
one (image, BLOCK_M rows of it) tile found from the running sum of cdiv(n_b, BLOCK_M) over CU, so its key loop runs
that image's keys only, from 0 (Triton 3.8 pipelines only such loops).

Times (CUDA-graph replays, benchmarks.kernel.graph_time_us) at deit's shapes (H=12, D=64, fp16, qkv bias):
B = 1, 4, 32, 128 at L = 197 and 99 (uniform), and cls-mass-like ragged lengths; the shipped kernel and config, the
shipped kernel over other configs, the prototype over configs, and torch SDPA on the padded batch (cudnn / flash).
Checks every variant against the shipped kernel first. Writes attn_tiles_<date>_<gpu>.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from benchmarks.env import environment, probe_result_path
from benchmarks.kernel import graph_time_us
from raggedvit.kernels._config import pick_config
from raggedvit.kernels._launch import _launch_triton, scale_bits

H, D = 12, 64
SHIPPED_VARIANTS = ((32, 64, 4, 3), (64, 32, 4, 3), (64, 64, 4, 3), (128, 64, 8, 3), (128, 32, 8, 3))
PER_SEQ_VARIANTS = ((32, 64, 4, 3), (64, 32, 4, 3), (64, 64, 4, 3), (64, 64, 4, 2), (128, 64, 8, 3), (64, 128, 4, 2))


@triton.jit
def _attn_per_seq(
    QKV, Bias, CU, Out, T, B, H, D, scale_bits,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    """grid = (T // BLOCK_M + B + 2, H): program p is tile p of the list (image 0's tiles, image 1's, ..., then the
    dead rows' tiles from cu[B]); out of range: nothing."""
    pid = tl.program_id(0)
    h = tl.program_id(1)
    offs_c = tl.arange(0, CHUNK)
    # image b of tile pid: the running sum of tiles_b = cdiv(n_b, BLOCK_M), CHUNK images at a time
    carry = pid * 0
    b_sel = pid * 0 - 1
    first = pid * 0
    for c0 in range(0, B, CHUNK):
        bb = c0 + offs_c
        ok = bb < B
        lo = tl.minimum(tl.maximum(tl.load(CU + bb, mask=ok, other=0), 0), T)
        hi = tl.minimum(tl.maximum(tl.load(CU + bb + 1, mask=ok, other=0), lo), T)
        tiles = tl.where(ok, (hi - lo + BLOCK_M - 1) // BLOCK_M, 0).to(tl.int32)
        incl = tl.cumsum(tiles, axis=0) + carry
        hit = ok & (incl > pid) & (incl - tiles <= pid)
        b_sel = tl.maximum(b_sel, tl.max(tl.where(hit, bb, -1), axis=0))
        first = tl.maximum(first, tl.max(tl.where(hit, incl - tiles, 0), axis=0))
        carry += tl.sum(tiles, axis=0)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    row_stride = 3 * H * D
    head_off = h * D
    if b_sel >= 0:
        start = tl.minimum(tl.maximum(tl.load(CU + b_sel), 0), T)
        end = tl.minimum(tl.maximum(tl.load(CU + b_sel + 1), start), T)
        rows = start + (pid - first) * BLOCK_M + offs_m
        row_ok = rows < end
        qk_scale = scale_bits.to(tl.float32, bitcast=True) * 1.4426950408889634
        q = tl.load(QKV + rows.to(tl.int64)[:, None] * row_stride + head_off + offs_d[None, :],
                    mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # fmt: skip
        q = q + tl.load(Bias + head_off + offs_d, mask=d_ok, other=0.0)[None, :]
        vb = tl.load(Bias + 2 * H * D + head_off + offs_d, mask=d_ok, other=0.0).to(tl.float32)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.full([BLOCK_M], 0.0, dtype=tl.float32)
        acc = tl.full([BLOCK_M, BLOCK_D], 0.0, dtype=tl.float32)
        n = end - start
        for start_n in range(0, n, BLOCK_N):
            cols = start + start_n + tl.arange(0, BLOCK_N)
            c_ok = cols < end
            k_ptrs = QKV + cols.to(tl.int64)[:, None] * row_stride + (H * D + head_off) + offs_d[None, :]
            k = tl.load(k_ptrs, mask=c_ok[:, None] & d_ok[None, :], other=0.0)
            s = tl.dot(q, tl.trans(k)) * qk_scale
            s = tl.where(c_ok[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.math.exp2(s - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(k_ptrs + H * D, mask=c_ok[:, None] & d_ok[None, :], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None] + vb[None, :]
        tl.store(Out + rows.to(tl.int64)[:, None] * (H * D) + head_off + offs_d[None, :], out.to(Out.dtype.element_ty),
                 mask=row_ok[:, None] & d_ok[None, :])  # fmt: skip
    else:  # a tile of dead rows [cu[B], T): zeros
        live = tl.minimum(tl.maximum(tl.load(CU + B), 0), T)
        rows = live + (pid - carry) * BLOCK_M + offs_m
        ok = (rows < T) & (pid >= carry)
        zeros = tl.zeros([BLOCK_M, BLOCK_D], dtype=Out.dtype.element_ty)
        tl.store(Out + rows.to(tl.int64)[:, None] * (H * D) + head_off + offs_d[None, :], zeros,
                 mask=ok[:, None] & d_ok[None, :])  # fmt: skip


def _lengths(B: int, kind: str, gen: torch.Generator) -> list[int]:
    if kind == "ragged":  # cls-mass-like: 45% .. 14% of 196 patches kept, + the class token
        return (torch.randint(20, 120, (B,), generator=gen) + 1).tolist()
    return [int(kind)] * B


def _case(B: int, kind: str) -> list[dict[str, Any]]:
    gen = torch.Generator().manual_seed(B * 31 + len(kind))
    lengths = _lengths(B, kind, gen)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64, device="cuda")
    T = int(cu[-1])
    qkv = torch.randn(T, 3 * H * D, generator=gen).to(torch.float16).cuda()
    bias = (torch.randn(3 * H * D, generator=gen) * 0.1).to(torch.float16).cuda()
    scale = D**-0.5
    ref, _ = _launch_triton(qkv, cu, H, scale, False, bias=bias)
    recs: list[dict[str, Any]] = []
    base = {"B": B, "lengths": kind, "T": T}
    shipped = pick_config(T, D, torch.float16)

    def add(impl: str, fn, cfg: tuple[int, ...] | None, out: torch.Tensor | None) -> None:
        rec = {**base, "impl": impl, "config": cfg}
        try:
            if out is not None:
                fn()
                rec["max_abs_diff"] = float((out.float() - ref.float()).abs().max())
            rec["gpu_us"] = graph_time_us(fn, inner=20, reps=9)[0]
        except Exception as exc:  # noqa: BLE001 - recorded (e.g. out of shared memory)
            rec["error"] = repr(exc)[:200]
        recs.append(rec)

    add("shipped", lambda: _launch_triton(qkv, cu, H, scale, False, bias=bias),
        (shipped.block_m, shipped.block_n, shipped.num_warps, shipped.num_stages), None)  # fmt: skip
    for bm, bn, w, st in SHIPPED_VARIANTS:
        cfg = dataclasses.replace(shipped, block_m=bm, block_n=bn, num_warps=w, num_stages=st)
        out = torch.empty_like(ref)
        add("shipped-kernel", lambda cfg=cfg, out=out: _launch_triton(qkv, cu, H, scale, False, bias=bias, config=cfg,
            out=out), (bm, bn, w, st), out)  # fmt: skip
    bits = scale_bits(scale)
    for bm, bn, w, st in PER_SEQ_VARIANTS:
        out = torch.empty_like(ref)

        def run(bm=bm, bn=bn, w=w, st=st, out=out) -> None:
            _attn_per_seq[(T // bm + B + 2, H)](qkv, bias, cu, out, T, B, H, D, bits, BLOCK_M=bm, BLOCK_N=bn,
                                                 BLOCK_D=64, CHUNK=256, num_warps=w, num_stages=st)  # fmt: skip

        add("per-seq", run, (bm, bn, w, st), out)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    path = probe_result_path(args.out, "attn_tiles")
    records: list[dict[str, Any]] = []
    data = {"benchmark": "attn_tiles", "env": environment(), "H": H, "D": D, "records": records}
    for kind in ("197", "99", "ragged"):
        for B in (1, 4, 32, 128):
            recs = _case(B, kind)
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
