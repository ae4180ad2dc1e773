"""Probe: where the ragged attention forward kernel loses to cudnn at deit's short sequences.

    python3 -m benchmarks.attn_variants [--out benchmarks/results] [--quick]

The serving profile had `_ragged_attn_fwd` at ~1.6x cudnn's flash attention (deit_base B=128, L=197). This probe
times, at deit shapes (H=12, D=64, fp16, qkv bias; uniform L = 197 / 99 and cls-mass-like ragged lengths):

- `shipped`: the shipped kernel and config (`_launch_triton`);
- `proto[map, BM, BN, warps, stages(, opt)]`: a prototype of the forward (no position bias, no Lse) whose query tile
  comes from `map` 0: a scan of CU per program (`_seq_tile` below, the shipped kernel up to commit 6835049);
  1: the grid (program (b, j) runs tiles j, j + J, ... of sequence b, J = cdiv(cdiv(T, B), BM), the shipped kernel
  since); 2: as 1 with the first tile outside the loop; 3: as 2 with the running max of CU (one vector load).
  opt 1: the max on raw scores with one FMA into exp2, and only the last key block masked;
- `sdpa-cudnn` / `sdpa-flash`: torch SDPA on the padded batch (uniform lengths only).

Results (H200, JIT, shipped = the scan kernel): attn_variants_2026-12-03_NVIDIA-H200{,_run2,_run3}.json: map 1 saves
1.0-2.1 us a call at B <= 4 and 3-15% at B = 32 / 128; maps 2 and 3 and opt 1 are slower.
Every prototype is checked against the shipped kernel's output first. Writes attn_variants_<date>_<gpu>.json.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
import triton
import triton.language as tl

from benchmarks.attn_tiles import Candidate, D, H, time_case
from benchmarks.env import environment, probe_result_path
from raggedvit.kernels._kernel import _add_fn, _dot, _max_combine, _max_fn
from raggedvit.kernels._launch import _launch_triton, scale_bits

_CU_CHUNK = tl.constexpr(256)  # cu entries per step of the tile search


@triton.jit
def _seq_tile(CU, pid, T, B, BLOCK_M: tl.constexpr):
    """MAP 0, the forward kernel's query-tile search up to commit 6835049: tile `pid` of the list -> (first row, row
    limit, key start, key end), all in [0, T].

    Sequence b spans [f'(b), f'(b+1)) with f' the running max of f (f(0) = 0, f(b) = CU[b] clamped to [0, T]);
    its tiles are its rows in BLOCK_M chunks, listed sequence by sequence, then the dead rows [f'(B), T) in chunks
    (keys: none). A pid past the list gives rows >= T. CU is scanned _CU_CHUNK entries at a time (any B).
    """
    offs = tl.arange(0, _CU_CHUNK)
    tiles_before = pid * 0  # tiles of the chunks already scanned
    top = pid * 0  # f' at the end of the chunks already scanned
    first = pid * 0 - 1  # list index of the hit sequence's first tile (-1: no hit)
    lo_hit = pid * 0
    hi_hit = pid * 0
    for c0 in range(0, B, _CU_CHUNK):
        bb = c0 + offs
        ok = bb < B
        f_lo = tl.minimum(tl.maximum(tl.load(CU + bb, mask=ok & (bb > 0), other=0), 0), T).to(tl.int32)
        f_hi = tl.minimum(tl.maximum(tl.load(CU + bb + 1, mask=ok, other=0), 0), T).to(tl.int32)
        lo = tl.maximum(tl.associative_scan(f_lo, 0, _max_combine), top)  # f'(b) (the interpreter scans only with this)
        hi = tl.maximum(lo, f_hi)  # f'(b + 1)
        tiles = tl.where(ok, (hi - lo + BLOCK_M - 1) // BLOCK_M, 0)
        incl = tl.associative_scan(tiles, 0, _add_fn) + tiles_before
        hit = ok & (incl - tiles <= pid) & (pid < incl)
        first = tl.maximum(first, tl.reduce(tl.where(hit, incl - tiles, -1), 0, _max_fn))
        lo_hit = tl.maximum(lo_hit, tl.reduce(tl.where(hit, lo, 0), 0, _max_fn))
        hi_hit = tl.maximum(hi_hit, tl.reduce(tl.where(hit, hi, 0), 0, _max_fn))
        tiles_before += tl.reduce(tiles, 0, _add_fn)
        top = tl.maximum(top, tl.reduce(tl.where(ok, hi, 0), 0, _max_fn))
    live = first >= 0
    row0 = tl.where(live, lo_hit + (pid - first) * BLOCK_M, top + (pid - tiles_before) * BLOCK_M)
    return row0, tl.where(live, hi_hit, T), tl.where(live, lo_hit, 0), tl.where(live, hi_hit, 0)


@triton.jit
def _proto_tile(QKV, Out, rows, row_lim, lo, hi, h, H, D, qb, vb, qk_scale,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, OPT: tl.constexpr):  # fmt: skip
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    row_stride = 3 * H * D
    head_off = h * D
    row_ok = rows < row_lim
    q = tl.load(QKV + rows.to(tl.int64)[:, None] * row_stride + head_off + offs_d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # fmt: skip
    q = q + qb[None, :]
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, dtype=tl.float32)
    acc = tl.full([BLOCK_M, BLOCK_D], 0.0, dtype=tl.float32)
    if OPT == 0:
        for start_n in range(0, hi - lo, BLOCK_N):
            cols = lo + start_n + tl.arange(0, BLOCK_N)
            kv_mask = (cols < hi)[:, None] & d_ok[None, :]
            k_ptrs = QKV + cols.to(tl.int64)[:, None] * row_stride + (H * D + head_off) + offs_d[None, :]
            k = tl.load(k_ptrs, mask=kv_mask, other=0.0)
            s = _dot(q, tl.trans(k)) * qk_scale
            s = tl.where((cols < hi)[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.reduce(s, 1, _max_fn))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.math.exp2(s - m_use[:, None])
            alpha = tl.math.exp2(m_i - m_use)
            l_i = l_i * alpha + tl.reduce(p, 1, _add_fn)
            v = tl.load(k_ptrs + H * D, mask=kv_mask, other=0.0)
            acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v)
            m_i = m_new
    else:
        # OPT 1: m on raw scores, p = exp2(s * c - m * c) (one FMA); full key blocks unmasked, the tail masked
        n_full = (hi - lo) // BLOCK_N * BLOCK_N
        for start_n in range(0, n_full, BLOCK_N):
            cols = lo + start_n + tl.arange(0, BLOCK_N)
            k_ptrs = QKV + cols.to(tl.int64)[:, None] * row_stride + (H * D + head_off) + offs_d[None, :]
            k = tl.load(k_ptrs, mask=d_ok[None, :], other=0.0)
            s = _dot(q, tl.trans(k))
            m_new = tl.maximum(m_i, tl.reduce(s, 1, _max_fn))
            mc = m_new * qk_scale
            p = tl.math.exp2(s * qk_scale - mc[:, None])
            alpha = tl.math.exp2(m_i * qk_scale - mc)
            l_i = l_i * alpha + tl.reduce(p, 1, _add_fn)
            v = tl.load(k_ptrs + H * D, mask=d_ok[None, :], other=0.0)
            acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v)
            m_i = m_new
        if n_full < hi - lo:
            cols = lo + n_full + tl.arange(0, BLOCK_N)
            kv_mask = (cols < hi)[:, None] & d_ok[None, :]
            k_ptrs = QKV + cols.to(tl.int64)[:, None] * row_stride + (H * D + head_off) + offs_d[None, :]
            k = tl.load(k_ptrs, mask=kv_mask, other=0.0)
            s = _dot(q, tl.trans(k))
            s = tl.where((cols < hi)[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.reduce(s, 1, _max_fn))
            mc = m_new * qk_scale
            p = tl.math.exp2(s * qk_scale - mc[:, None])
            alpha = tl.math.exp2(m_i * qk_scale - mc)
            l_i = l_i * alpha + tl.reduce(p, 1, _add_fn)
            v = tl.load(k_ptrs + H * D, mask=kv_mask, other=0.0)
            acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v)
            m_i = m_new
    has_keys = l_i > 0.0
    out = tl.where(has_keys[:, None], acc / tl.where(has_keys, l_i, 1.0)[:, None] + vb[None, :], 0.0)
    o_ptrs = Out + rows.to(tl.int64)[:, None] * (H * D) + head_off + offs_d[None, :]
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


@triton.jit
def _proto_fwd(
    QKV, Bias, CU, Out, T, B, H, D, J, scale_bits,
    MAP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, OPT: tl.constexpr,
):  # fmt: skip
    """MAP 0: tile from the CU scan; 1: program (b, j) loops over tiles j, j + J, ...; 2: as 1 with the first
    tile peeled out of the loop; 3: as 2 with lo = max(clamp(cu[0..b])) (the running max, one vector load)."""
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    qk_scale = scale_bits.to(tl.float32, bitcast=True) * 1.4426950408889634
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    head_off = h * D
    qb = tl.load(Bias + head_off + offs_d, mask=d_ok, other=0.0)
    vb = tl.load(Bias + 2 * H * D + head_off + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    if MAP == 0:
        row0, row_lim, lo, hi = _seq_tile(CU, pid_m, T, B, BLOCK_M)
        rows = row0 + tl.arange(0, BLOCK_M)
        _proto_tile(QKV, Out, rows, row_lim, lo, hi, h, H, D, qb, vb, qk_scale, BLOCK_M, BLOCK_N, BLOCK_D, OPT)
    else:
        b = pid_m // J
        j = pid_m - b * J
        if MAP == 3:
            offs = tl.arange(0, 256)
            prev = tl.load(CU + offs, mask=(offs <= b) & (offs > 0), other=0)
            lo = tl.minimum(tl.maximum(tl.reduce(prev, 0, _max_fn), 0), T).to(tl.int32)
        else:
            lo = tl.minimum(tl.maximum(tl.load(CU + b), 0), T).to(tl.int32)
        hi = tl.maximum(lo, tl.minimum(tl.maximum(tl.load(CU + b + 1), 0), T).to(tl.int32))
        row0 = lo + j * BLOCK_M
        stride = J * BLOCK_M
        n_tiles = tl.cdiv(tl.maximum(hi - row0, 0), stride)
        if MAP == 1:
            for t in range(0, n_tiles):
                rows = row0 + t * stride + tl.arange(0, BLOCK_M)
                _proto_tile(QKV, Out, rows, hi, lo, hi, h, H, D, qb, vb, qk_scale, BLOCK_M, BLOCK_N, BLOCK_D, OPT)
        else:
            if n_tiles > 0:
                rows = row0 + tl.arange(0, BLOCK_M)
                _proto_tile(QKV, Out, rows, hi, lo, hi, h, H, D, qb, vb, qk_scale, BLOCK_M, BLOCK_N, BLOCK_D, OPT)
            for t in range(1, n_tiles):
                rows = row0 + t * stride + tl.arange(0, BLOCK_M)
                _proto_tile(QKV, Out, rows, hi, lo, hi, h, H, D, qb, vb, qk_scale, BLOCK_M, BLOCK_N, BLOCK_D, OPT)


def _proto(qkv, bias, cu, out, B: int, map_: int, bm: int, bn: int, warps: int, stages: int, opt: int = 0) -> None:
    T = qkv.shape[0]
    if map_ == 0:
        grid = (T // bm + B + 2, H)
        J = 1
    else:
        J = triton.cdiv(triton.cdiv(T, B), bm)
        grid = (B * J, H)
    if map_ == 3:
        assert B < 256
    _proto_fwd[grid](qkv, bias, cu, out, T, B, H, D, J, scale_bits(D**-0.5), MAP=map_, OPT=opt, BLOCK_M=bm, BLOCK_N=bn,
                     BLOCK_D=64, num_warps=warps, num_stages=stages)  # fmt: skip


VARIANTS = [(1, 64, bn, 4, st, opt) for opt in (0, 1) for bn, st in ((32, 3), (32, 2), (64, 2), (64, 3), (128, 2))] + [
    (0, 64, 32, 4, 3, 0)
]
QUICK = [(m, 64, bn, 4, st) for m in (0, 1) for bn, st in ((32, 3), (64, 3), (128, 2))]


def _prototypes(variants):
    """`time_case` candidates: the shipped kernel, then the prototype over `variants`."""

    def candidates(qkv, bias, cu, ref) -> list[Candidate]:
        B = cu.shape[0] - 1
        out: list[Candidate] = [("shipped", lambda: _launch_triton(qkv, cu, H, D**-0.5, False, bias=bias), None, None)]
        for v in variants:
            y = torch.empty_like(ref)
            out.append(("proto", lambda v=v, y=y: _proto(qkv, bias, cu, y, B, *v), list(v), y))
        return out

    return candidates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--suffix", default="")
    args = ap.parse_args()
    path = probe_result_path(args.out, "attn_variants" + args.suffix)
    records: list[dict[str, Any]] = []
    data = {"benchmark": "attn_variants", "env": environment(), "H": H, "D": D, "records": records}
    variants = QUICK if args.quick else VARIANTS
    for kind in ("197", "99", "ragged"):
        for B in (1, 4, 32, 128):
            recs = time_case(B, kind, _prototypes(variants))
            records += recs
            best = sorted((r for r in recs if "gpu_us" in r), key=lambda r: r["gpu_us"])[:4]
            bad = [r["config"] for r in recs if r.get("max_abs_diff", 0) > 2e-2 or "error" in r]
            ship = next(r.get("gpu_us") for r in recs if r["impl"] == "shipped")
            cells = " ".join(f"{r['impl']}{r['config'] or ''}={r['gpu_us']:.1f}" for r in best)
            print(f"L={kind} B={B}: shipped={ship:.1f} best: {cells} bad={bad}", flush=True)
            path.write_text(json.dumps(data, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
