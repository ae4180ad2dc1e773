"""Triton kernel of the block engine: one persistent launch runs one whole pre-norm ViT block on packed rows
(`raggedvit.kernels.reference.vit_block_reference` defines the result; DESIGN.md section 1 the attention).

Layout (row-major, contiguous): X / X1 / Y [T, C] (the residual stream's dtype), CU [B+1] int32/int64, weights in
nn.Linear's layout (Wqkv [3C, C], Wproj [C, C], Wfc1 [F, C], Wfc2 [C, F]) and their biases in the GEMM dtype, norm
weights and LayerScales [C] in any float dtype (read as fp32). Scratch: Qkv [T, 3C] and Att [T, C] and Hid [T, F]
in the GEMM dtype, Lse [H, T] fp32 (with cls_attn), Cls [T] fp32, Sync [1] int64 (the grid barrier's counter).

The block runs as five phases over the live rows [0, live), live = clamp(CU[B], 0, T), read on the device:
    0  qkv:  Qkv = LN1(X) @ Wqkv^T + bqkv          LayerNorm in the GEMM's prologue from per-row fp32 statistics
    1  attn: Att = ragged attention of Qkv           tasks (sequence, query tile group, head), `_kernel._fwd_tile`
    2  proj: X1 = X + ls1 * (Att @ Wproj^T + bproj)  (+ Cls tiles, `_kernel._cls_attn_tile`, with CLS_ATTN)
    3  fc1:  Hid = GELU(LN2(X1) @ Wfc1^T + bfc1)     LayerNorm in the prologue again, GELU (erf) in the epilogue
    4  fc2:  Y = X1 + ls2 * (Hid @ Wfc2^T + bfc2)    rows [live, T) of Y are written as zeros
Every program of the grid walks the same static list of tiles of a phase (tile t goes to program t mod grid), then
waits at a grid-wide barrier before the next phase. The grid must be co-resident (the launcher sizes it from the SM
count, never from the work); a grid of one program runs the phases in order with every barrier met at once (the
sequential mode, also the interpreter's). Only the phases in [ph_lo, ph_hi) run (the benchmark times each alone).

The barrier: each program adds 1 to Sync (release, after a CTA barrier), the target is the next multiple of the
grid size above the value it found, and it polls Sync (atomic adds of 0 with acquire semantics) until the target
is reached. Sync only grows (int64), so replays of a CUDA graph need no reset, as long as one counter serves one grid
size at a time and one launch at a time (the launcher keeps one counter per device and grid size). A spin gives up
after SPIN_LIMIT polls (the result is then wrong, never a hang).

Tiles: GEMM tiles are BM x BN of the output, ordered column-block-major (the BM-row tiles of one weight column
block are adjacent, so a weight tile comes from HBM once and from L2 after); the number of row tiles follows live.
fp32 (GEMM dtype) uses input_precision="ieee" (no tf32); fp16 / bf16 dots accumulate in fp32; the normalized
rows are rounded to the GEMM dtype before their dot.
"""

from __future__ import annotations

import triton
import triton.language as tl

from raggedvit.kernels._kernel import _add_fn, _cls_attn_tile, _dot, _fwd_tile
from raggedvit.kernels._linear_kernel import gelu_erf

__all__ = ["PHASES", "_vit_block"]

PHASES = ("qkv", "attn", "proj", "fc1", "fc2")


@triton.jit
def _grid_sync(Sync, nprog, SPIN_LIMIT: tl.constexpr):
    """Grid-wide barrier over `nprog` co-resident programs (module docstring)."""
    tl.debug_barrier()  # every thread's stores of the phase are issued before the release
    old = tl.atomic_add(Sync, 1, sem="acq_rel", scope="gpu")
    target = (old // nprog + 1) * nprog
    cur = old + 1
    spins = 0
    while (cur < target) & (spins < SPIN_LIMIT):
        cur = tl.atomic_add(Sync, 0, sem="acquire", scope="gpu")  # the poll that sees the target acquires
        spins += 1
    tl.debug_barrier()


@triton.jit
def _linear_tile(
    A, LnW, LnB, W, Bias, Gamma, Res, Y, m0, n0, live, T, K, N, eps,
    HAS_LN: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_GAMMA: tl.constexpr, HAS_RES: tl.constexpr,
    ACT: tl.constexpr, ZERO_DEAD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    """Y[m0 : m0+BM, n0 : n0+BN] = act(LN(A) @ W^T + Bias) * Gamma + Res on the rows < live (A [T, K], W [N, K],
    Y / Res [T, N]); rows at or past live are never read; with ZERO_DEAD they are written as zeros (below T),
    else not written. LN(a) = (a - mean) * rstd * LnW + LnB with fp32 mean and rstd = 1/sqrt(var + eps) of the row
    (biased variance, one pass of sums)."""
    rows = m0 + tl.arange(0, BM)
    cols = n0 + tl.arange(0, BN)
    row_ok = rows < live
    col_ok = cols < N
    offs_k = tl.arange(0, BK)
    a_rows = A + rows.to(tl.int64)[:, None] * K
    w_rows = W + cols.to(tl.int64)[:, None] * K
    if HAS_LN:
        s1 = tl.zeros([BM], dtype=tl.float32)
        s2 = tl.zeros([BM], dtype=tl.float32)
        for k0 in range(0, K, BK):
            ks = k0 + offs_k
            a = tl.load(a_rows + ks[None, :], mask=row_ok[:, None] & (ks < K)[None, :], other=0.0).to(tl.float32)
            s1 += tl.reduce(a, 1, _add_fn)
            s2 += tl.reduce(a * a, 1, _add_fn)
        mean = s1 / K
        var = tl.maximum(s2 / K - mean * mean, 0.0)
        rstd = 1.0 / tl.sqrt(var + eps)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        ks = k0 + offs_k
        k_ok = ks < K
        a = tl.load(a_rows + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        wt = tl.load(w_rows + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        if HAS_LN:
            g = tl.load(LnW + ks, mask=k_ok, other=0.0).to(tl.float32)
            b = tl.load(LnB + ks, mask=k_ok, other=0.0).to(tl.float32)
            a = (a.to(tl.float32) - mean[:, None]) * (rstd[:, None] * g[None, :]) + b[None, :]
        acc += _dot(a.to(wt.dtype), tl.trans(wt))
    if HAS_BIAS:
        acc += tl.load(Bias + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if ACT:
        acc = gelu_erf(acc)
    if HAS_GAMMA:
        acc = acc * tl.load(Gamma + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
    if HAS_RES:
        acc += tl.load(Res + offs, mask=row_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
    if ZERO_DEAD:
        acc = tl.where(row_ok[:, None], acc, 0.0)
        tl.store(Y + offs, acc.to(Y.dtype.element_ty), mask=(rows < T)[:, None] & col_ok[None, :])
    else:
        tl.store(Y + offs, acc.to(Y.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _zero_rows(Y, m0, T, N, BM: tl.constexpr, BN: tl.constexpr):
    """Y[m0 : m0+BM] = 0 (rows below T), N columns in BN chunks."""
    rows = m0 + tl.arange(0, BM)
    zeros = tl.zeros([BM, BN], dtype=Y.dtype.element_ty)
    for n0 in range(0, N, BN):
        cols = n0 + tl.arange(0, BN)
        tl.store(
            Y + rows.to(tl.int64)[:, None] * N + cols[None, :], zeros, mask=(rows < T)[:, None] & (cols < N)[None, :]
        )


@triton.jit
def _linear_phase(
    A, LnW, LnB, W, Bias, Gamma, Res, Y, pid, nprog, live, T, K, N, eps,
    HAS_LN: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_GAMMA: tl.constexpr, HAS_RES: tl.constexpr,
    ACT: tl.constexpr, ZERO_DEAD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    """This program's tiles of one GEMM phase: tiles t = pid, pid + nprog, ... below cdiv(live, BM) * cdiv(N, BN)
    (row tile t mod n_m, column block t div n_m). With ZERO_DEAD, also the tiles of rows [n_m * BM, T) as zeros."""
    n_m = (live + BM - 1) // BM
    n_tiles = n_m * ((N + BN - 1) // BN)
    for t in range(pid, n_tiles, nprog):
        nb = t // n_m
        _linear_tile(A, LnW, LnB, W, Bias, Gamma, Res, Y, (t - nb * n_m) * BM, nb * BN, live, T, K, N, eps,
                     HAS_LN, HAS_BIAS, HAS_GAMMA, HAS_RES, ACT, ZERO_DEAD, BM, BN, BK)  # fmt: skip
    if ZERO_DEAD:
        n_dead = (tl.maximum(T - n_m * BM, 0) + BM - 1) // BM
        # the zero tiles go to the programs after the last GEMM tile's
        first = (pid - n_tiles % nprog + nprog) % nprog
        for t in range(first, n_dead, nprog):
            _zero_rows(Y, (n_m + t) * BM, T, N, BM, BN)


@triton.jit
def _attn_phase(
    Qkv, Att, Lse, CU, pid, nprog, T, B, J, H, D, qk_scale, store_lse,
    ATT_BM: tl.constexpr, ATT_BN: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """This program's attention tasks: task t = (b, j, h) (h fastest) runs query tiles j, j + J, ... of sequence b,
    head h (as `_kernel._ragged_attn_fwd` does per program); Lse rows stored when store_lse != 0. Rows past the
    sequences are not written (no later phase reads them)."""
    qb = tl.zeros([BLOCK_D], dtype=Qkv.dtype.element_ty)  # the qkv bias is already in Qkv
    vb = tl.zeros([BLOCK_D], dtype=tl.float32)
    for t in range(pid, B * J * H, nprog):
        bj = t // H
        h = t - bj * H
        b = bj // J
        j = bj - b * J
        lo = tl.where(b == 0, 0, tl.minimum(tl.maximum(tl.load(CU + b), 0), T)).to(tl.int32)
        hi = tl.maximum(lo, tl.minimum(tl.maximum(tl.load(CU + b + 1), 0), T).to(tl.int32))
        first = lo + j * ATT_BM
        step = J * ATT_BM
        for i in range(0, (tl.maximum(hi - first, 0) + step - 1) // step):
            rows = first + i * step + tl.arange(0, ATT_BM)
            _fwd_tile(Qkv, Att, Lse, Lse, CU, rows, lo, hi, h, T, H, D, qk_scale, qb, vb, store_lse, 0, 0, 0,
                      ATT_BM, ATT_BN, BLOCK_D, False)  # fmt: skip


@triton.jit(do_not_specialize=["T", "B", "J", "ph_lo", "ph_hi"])
def _vit_block(
    X, CU, Ln1W, Ln1B, Wqkv, Bqkv, Wproj, Bproj, Ls1, Ln2W, Ln2B, Wfc1, Bfc1, Wfc2, Bfc2, Ls2,
    Qkv, Att, Lse, Cls, X1, Hid, Y, Sync,
    T, B, J, C, F, H, D, eps, qk_scale, ph_lo, ph_hi,
    HAS_QKV_B: tl.constexpr, HAS_PROJ_B: tl.constexpr, HAS_FC1_B: tl.constexpr, HAS_FC2_B: tl.constexpr,
    HAS_LS1: tl.constexpr, HAS_LS2: tl.constexpr, CLS_ATTN: tl.constexpr,
    BM: tl.constexpr, BN_WIDE: tl.constexpr, BN_NARROW: tl.constexpr, BK: tl.constexpr,
    ATT_BM: tl.constexpr, ATT_BN: tl.constexpr, BLOCK_D: tl.constexpr, CLS_BN: tl.constexpr, CLS_HG: tl.constexpr,
    SPIN_LIMIT: tl.constexpr,
):  # fmt: skip
    """Phases [ph_lo, ph_hi) of the block (module docstring) on a co-resident grid of any size >= 1.

    J >= 1 query-tile groups per sequence (the launcher: cdiv(cdiv(T, B), ATT_BM)); qk_scale = scale * log2(e);
    B >= 0 (CU has B + 1 entries). Qkv's width is 3C = 3 * H * D; BN_WIDE tiles qkv and fc1, BN_NARROW proj and
    fc2 (fewer output columns: narrower tiles keep more programs busy)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    live = tl.minimum(tl.maximum(tl.load(CU + B), 0), T)
    live = tl.where(B == 0, 0, live)
    if (ph_lo <= 0) & (ph_hi > 0):
        _linear_phase(X, Ln1W, Ln1B, Wqkv, Bqkv, Bqkv, X, Qkv, pid, nprog, live, T, C, 3 * C, eps,
                      True, HAS_QKV_B, False, False, False, False, BM, BN_WIDE, BK)  # fmt: skip
    if (ph_lo <= 0) & (ph_hi > 1):
        _grid_sync(Sync, nprog, SPIN_LIMIT)
    if (ph_lo <= 1) & (ph_hi > 1):
        _attn_phase(Qkv, Att, Lse, CU, pid, nprog, T, B, J, H, D, qk_scale, 1 if CLS_ATTN else 0,
                    ATT_BM, ATT_BN, BLOCK_D)  # fmt: skip
    if (ph_lo <= 1) & (ph_hi > 2):
        _grid_sync(Sync, nprog, SPIN_LIMIT)
    if (ph_lo <= 2) & (ph_hi > 2):
        if CLS_ATTN:  # the cls tiles come first: programs past their count start on proj at once
            n_cls = (T + CLS_BN - 1) // CLS_BN
            for t in range(pid, n_cls, nprog):
                _cls_attn_tile(Qkv, Qkv, CU, Lse, Cls, Lse, CU, t * CLS_BN, T, B, H, D, qk_scale, 0, 0, 0, 0,
                               CLS_BN, BLOCK_D, False, CLS_HG)  # fmt: skip
            p2 = (pid - n_cls % nprog + nprog) % nprog
        else:
            p2 = pid
        _linear_phase(Att, Ln1W, Ln1B, Wproj, Bproj, Ls1, X, X1, p2, nprog, live, T, C, C, eps,
                      False, HAS_PROJ_B, HAS_LS1, True, False, False, BM, BN_NARROW, BK)  # fmt: skip
    if (ph_lo <= 2) & (ph_hi > 3):
        _grid_sync(Sync, nprog, SPIN_LIMIT)
    if (ph_lo <= 3) & (ph_hi > 3):
        _linear_phase(X1, Ln2W, Ln2B, Wfc1, Bfc1, Bfc1, X1, Hid, pid, nprog, live, T, C, F, eps,
                      True, HAS_FC1_B, False, False, True, False, BM, BN_WIDE, BK)  # fmt: skip
    if (ph_lo <= 3) & (ph_hi > 4):
        _grid_sync(Sync, nprog, SPIN_LIMIT)
    if (ph_lo <= 4) & (ph_hi > 4):
        _linear_phase(Hid, Ln2W, Ln2B, Wfc2, Bfc2, Ls2, X1, Y, pid, nprog, live, T, F, C, eps,
                      False, HAS_FC2_B, HAS_LS2, True, False, True, BM, BN_NARROW, BK)  # fmt: skip
