"""Triton kernel of the block engine: one persistent launch runs one whole pre-norm ViT block on packed rows
(`raggedvit.kernels.reference.vit_block_reference` defines the result; DESIGN.md section 1 the attention).

Layout (row-major, contiguous): X / X1 / Y [T, C] (the residual stream's dtype), CU [B+1] int32/int64, weights in
nn.Linear's layout (Wqkv [3C, C], Wproj [C, C], Wfc1 [F, C], Wfc2 [C, F]) and their biases in the GEMM dtype, norm
weights and LayerScales [C] in any float dtype (read as fp32). Scratch: Xn [T, C], Qkv [T, 3C], Att [T, C] and
Hid [T, F] in the GEMM dtype, Lse [H, T] fp32 (with cls_attn), Cls [T] fp32, Part / Ctr (split-K partial tiles and
their counters, `_linear_phase`, then the grid barrier's and the exit counter).

The block runs as seven phases over the live rows [0, live), live = clamp(CU[B], 0, T), read on the device:
    0  norm1: Xn = LN1(X)                              fp32 statistics, rounded to the GEMM dtype (as the dot's input)
    1  qkv:   Qkv = Xn @ Wqkv^T + bqkv
    2  attn:  Att = ragged attention of Qkv            tasks (sequence, query tile group, head), `_kernel._fwd_tile`
    3  proj:  X1 = X + ls1 * (Att @ Wproj^T + bproj)   split-K (+ Cls tiles, `_kernel._cls_attn_tile`, with CLS_ATTN)
    4  norm2: Xn = LN2(X1)
    5  fc1:   Hid = GELU(Xn @ Wfc1^T + bfc1)           GELU (erf) in the epilogue
    6  fc2:   Y = X1 + ls2 * (Hid @ Wfc2^T + bfc2)     split-K; rows [live, T) of Y are written as zeros
The norms are phases of their own (not GEMM prologues) so that the GEMMs' operand loads stay asynchronous copies
into shared memory (software pipelined), which a prologue's arithmetic on the operand prevents.
Every program of the grid walks the same static list of tiles of a phase (tile t goes to program t mod grid), then
waits at a grid-wide barrier before the next phase. The grid must be co-resident (the launcher sizes it from the SM
count, never from the work); a grid of one program runs the phases in order with every barrier met at once (the
sequential mode, also the interpreter's). Only the phases in [ph_lo, ph_hi) run (the benchmark times each alone).

The barrier: each program adds 1 to Sync (release, after a CTA barrier), the target is the next multiple of the
grid size above the value it found, and it polls Sync (atomic adds of 0 with acquire semantics) until the target
is reached. Sync and an exit counter are the last two int32 of the launch's Ctr workspace (zeros between
launches): after its last phase each program adds 1 to the exit counter, and the program that counts last (every
other program has left every barrier) sets both back to 0. So a CUDA graph replays with no reset node, and two
launches with distinct workspaces never share a counter (two streams at once are safe). A spin gives up after
SPIN_LIMIT polls (the result is then wrong, never a hang; the counters are reset all the same).

Tiles: GEMM tiles are BM x BN of the output, ordered column-block-major with M_FAST (the BM-row tiles of one weight
column block are adjacent) or row-block-major; the number of row tiles follows live.
fp32 (GEMM dtype) uses input_precision="ieee" (no tf32); fp16 / bf16 dots accumulate in fp32.
"""

from __future__ import annotations

import triton
import triton.language as tl

from raggedvit.kernels._kernel import _INTERPRETED, _add_fn, _cls_attn_tile, _dot, _fwd_tile
from raggedvit.kernels._linear_kernel import gelu_erf

__all__ = ["PHASES", "_vit_block"]

PHASES = ("norm1", "qkv", "attn", "proj", "norm2", "fc1", "fc2")


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
def _grid_exit(Sync, nprog):
    """Counts this program out (Sync[1]); the last one out sets Sync[0] and Sync[1] back to 0 (module docstring)."""
    tl.debug_barrier()
    if tl.atomic_add(Sync + 1, 1, sem="acq_rel", scope="gpu") == nprog - 1:
        tl.atomic_xchg(Sync, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(Sync + 1, 0, sem="release", scope="gpu")


@triton.jit
def _prefetch_l2(W, numel, pid, nprog, LINE: tl.constexpr, LINES: tl.constexpr):
    """Asks L2 for this program's 1/nprog share of W[0:numel] (prefetch.global.L2, one per LINE elements = 128 bytes;
    no register result, nothing waits for it); the interpreter skips it."""
    if not _INTERPRETED:
        share = (numel + nprog - 1) // nprog
        lo = pid * share
        hi = tl.minimum(lo + share, numel)
        for i in range(lo, hi, LINE * LINES):
            idx = tl.minimum(i + tl.arange(0, LINES) * LINE, numel - 1).to(tl.int64)
            tl.inline_asm_elementwise("mov.u32 $0, 0; prefetch.global.L2 [$1];", "=r,l", [W + idx], dtype=tl.int32,
                                      is_pure=False, pack=1)  # fmt: skip


@triton.jit
def _norm_phase(X, LnW, LnB, Xn, pid, nprog, live, C, eps, NR: tl.constexpr, BLOCK_C: tl.constexpr):
    """Xn[r] = LayerNorm(X[r]) * LnW + LnB for the rows r < live, NR rows per task (fp32 mean and biased variance,
    two passes over the row in registers), rounded to Xn's dtype."""
    offs_c = tl.arange(0, BLOCK_C)
    c_ok = offs_c < C
    g = tl.load(LnW + offs_c, mask=c_ok, other=0.0).to(tl.float32)
    b = tl.load(LnB + offs_c, mask=c_ok, other=0.0).to(tl.float32)
    for t in range(pid, (live + NR - 1) // NR, nprog):
        rows = t * NR + tl.arange(0, NR)
        mask = (rows < live)[:, None] & c_ok[None, :]
        offs = rows.to(tl.int64)[:, None] * C + offs_c[None, :]
        x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        mean = tl.reduce(x, 1, _add_fn) / C
        d = tl.where(mask, x - mean[:, None], 0.0)
        rstd = 1.0 / tl.sqrt(tl.reduce(d * d, 1, _add_fn) / C + eps)
        tl.store(Xn + offs, (d * rstd[:, None] * g[None, :] + b[None, :]).to(Xn.dtype.element_ty), mask=mask)


@triton.jit
def _mma(A, W, rows, cols, row_ok, col_ok, K, k_lo, k_hi, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """fp32 [BM, BN] = A[rows, k_lo:k_hi] @ W[cols, k_lo:k_hi]^T (A [T, K], W [N, K]); masked rows and columns read
    zeros. The loop starts at 0 (Triton 3.8 pipelines only such loops)."""
    offs_k = tl.arange(0, BK)
    a_ptrs = A + rows.to(tl.int64)[:, None] * K + k_lo + offs_k[None, :]
    w_ptrs = W + cols.to(tl.int64)[:, None] * K + k_lo + offs_k[None, :]
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, k_hi - k_lo, BK):
        k_ok = (k0 + offs_k) < (k_hi - k_lo)
        a = tl.load(a_ptrs + k0, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptrs + k0, mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        acc += _dot(a.to(w.dtype), tl.trans(w))
    return acc


@triton.jit
def _epilogue(
    acc, Bias, Gamma, Res, Y, rows, cols, row_ok, col_ok, T, N,
    HAS_BIAS: tl.constexpr, HAS_GAMMA: tl.constexpr, HAS_RES: tl.constexpr, ACT: tl.constexpr,
    ZERO_DEAD: tl.constexpr,
):  # fmt: skip
    """Y[rows, cols] = act(acc + Bias) * Gamma + Res, rounded to Y's dtype, on the live rows (row_ok); with
    ZERO_DEAD the tile's other rows below T are written as zeros, else left alone."""
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
        mask = (rows < T)[:, None] & (cols < N)[None, :]
        tl.store(Y + rows.to(tl.int64)[:, None] * N + cols[None, :], zeros, mask=mask)


@triton.jit
def _linear_phase(
    A, W, Bias, Gamma, Res, Y, Part, Ctr, pid, nprog, live, T, K, N,
    HAS_BIAS: tl.constexpr, HAS_GAMMA: tl.constexpr, HAS_RES: tl.constexpr, ACT: tl.constexpr,
    ZERO_DEAD: tl.constexpr, SPLIT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    M_FAST: tl.constexpr,
):  # fmt: skip
    """This program's tasks of one GEMM phase Y = epilogue(A @ W^T) (`_epilogue`) over the live rows.

    Output tiles (cdiv(live, BM) x cdiv(N, BN), row tile fastest with M_FAST, else column block fastest) times
    SPLIT slices of K are tasks t = pid, pid + nprog, ... (slice-major). SPLIT == 1: a task owns its tile. SPLIT > 1:
    a task writes its fp32 partial tile to Part[s] ([SPLIT, T, N]) and counts itself in Ctr[tile] (release /
    acquire); the task that counts last sums Part[0..SPLIT-1] in order (deterministic), runs the epilogue and sets
    Ctr[tile] back to 0 for the next launch.
    With ZERO_DEAD the rows [cdiv(live, BM) * BM, T) are zeroed by the tasks after the last."""
    n_m = (live + BM - 1) // BM
    n_n = (N + BN - 1) // BN
    n_tiles = n_m * n_n
    k_len = (((K + SPLIT - 1) // SPLIT + BK - 1) // BK) * BK
    for t in range(pid, n_tiles * SPLIT, nprog):
        s = t // n_tiles
        tile = t - s * n_tiles
        if M_FAST:  # the row tiles of one weight column block are adjacent tasks
            nb = tile // n_m
            mb = tile - nb * n_m
        else:  # adjacent tasks read different weight column blocks
            mb = tile // n_n
            nb = tile - mb * n_n
        rows = mb * BM + tl.arange(0, BM)
        cols = nb * BN + tl.arange(0, BN)
        row_ok = rows < live
        col_ok = cols < N
        k_lo = tl.minimum(s * k_len, K)
        acc = _mma(A, W, rows, cols, row_ok, col_ok, K, k_lo, tl.minimum(k_lo + k_len, K), BM, BN, BK)
        if SPLIT == 1:
            _epilogue(acc, Bias, Gamma, Res, Y, rows, cols, row_ok, col_ok, T, N,
                      HAS_BIAS, HAS_GAMMA, HAS_RES, ACT, ZERO_DEAD)  # fmt: skip
        else:
            offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
            mask = row_ok[:, None] & col_ok[None, :]
            tl.store(Part + s * T * N + offs, acc, mask=mask)
            tl.debug_barrier()
            if tl.atomic_add(Ctr + tile, 1, sem="acq_rel", scope="gpu") == SPLIT - 1:
                tot = tl.zeros([BM, BN], dtype=tl.float32)
                for s2 in tl.static_range(SPLIT):
                    tot += tl.load(Part + s2 * T * N + offs, mask=mask, other=0.0, cache_modifier=".cg")
                _epilogue(tot, Bias, Gamma, Res, Y, rows, cols, row_ok, col_ok, T, N,
                          HAS_BIAS, HAS_GAMMA, HAS_RES, ACT, ZERO_DEAD)  # fmt: skip
                tl.atomic_xchg(Ctr + tile, 0)
    if ZERO_DEAD:
        n_dead = (tl.maximum(T - n_m * BM, 0) + BM - 1) // BM
        # the zero tiles go to the programs after the last GEMM task's
        first = (pid - (n_tiles * SPLIT) % nprog + nprog) % nprog
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
    Xn, Qkv, Att, Lse, Cls, X1, Hid, Part, Ctr, Y,
    T, B, J, C, F, H, D, eps, qk_scale, ph_lo, ph_hi, max_tiles,
    HAS_QKV_B: tl.constexpr, HAS_PROJ_B: tl.constexpr, HAS_FC1_B: tl.constexpr, HAS_FC2_B: tl.constexpr,
    HAS_LS1: tl.constexpr, HAS_LS2: tl.constexpr, CLS_ATTN: tl.constexpr,
    BM: tl.constexpr, BN_WIDE: tl.constexpr, BN_NARROW: tl.constexpr, BK: tl.constexpr,
    SPLIT_PROJ: tl.constexpr, SPLIT_FC2: tl.constexpr, NORM_ROWS: tl.constexpr, BLOCK_C: tl.constexpr,
    ATT_BM: tl.constexpr, ATT_BN: tl.constexpr, BLOCK_D: tl.constexpr, CLS_BN: tl.constexpr, CLS_HG: tl.constexpr,
    M_FAST: tl.constexpr, PREFETCH: tl.constexpr, PF_LINE: tl.constexpr, SPIN_LIMIT: tl.constexpr,
):  # fmt: skip
    """Phases [ph_lo, ph_hi) of the block (module docstring) on a co-resident grid of any size >= 1.

    J >= 1 query-tile groups per sequence (the launcher: cdiv(cdiv(T, B), ATT_BM)); qk_scale = scale * log2(e);
    B >= 0 (CU has B + 1 entries). Qkv's width is 3C = 3 * H * D; BN_WIDE tiles qkv and fc1, BN_NARROW proj and
    fc2, whose K is split SPLIT_PROJ / SPLIT_FC2 ways. Xn [T, C] (GEMM dtype) holds LN1(X), later LN2(X1); Part
    [max(SPLIT_PROJ, SPLIT_FC2), T, C] fp32 the split-K partial tiles; Ctr [2 * max_tiles + 2] int32 (zeros between
    launches, max_tiles = cdiv(T, BM) * cdiv(C, BN_NARROW)) their counters, proj's then fc2's, then the grid
    barrier's and the exit counter. PREFETCH: each
    program first asks L2 for its share of the four weights (`_prefetch_l2`, PF_LINE weight elements = 128 bytes),
    so the weight stream from HBM overlaps the norms, the attention and the barriers."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    Sync = Ctr + 2 * max_tiles
    live = tl.minimum(tl.maximum(tl.load(CU + B), 0), T)
    live = tl.where(B == 0, 0, live)
    if PREFETCH:  # every weight of the phases to run into L2 now: the GEMMs then wait on L2, not HBM
        if (ph_lo <= 1) & (ph_hi > 1):
            _prefetch_l2(Wqkv, 3 * C * C, pid, nprog, PF_LINE, 64)
        if (ph_lo <= 3) & (ph_hi > 3):
            _prefetch_l2(Wproj, C * C, pid, nprog, PF_LINE, 64)
        if (ph_lo <= 5) & (ph_hi > 5):
            _prefetch_l2(Wfc1, F * C, pid, nprog, PF_LINE, 64)
        if (ph_lo <= 6) & (ph_hi > 6):
            _prefetch_l2(Wfc2, C * F, pid, nprog, PF_LINE, 64)
    if (ph_lo <= 0) & (ph_hi > 0):
        _norm_phase(X, Ln1W, Ln1B, Xn, pid, nprog, live, C, eps, NORM_ROWS, BLOCK_C)
    if (ph_lo <= 0) & (ph_hi > 1):
        _grid_sync(Sync, nprog, SPIN_LIMIT)
    if (ph_lo <= 1) & (ph_hi > 1):
        _linear_phase(Xn, Wqkv, Bqkv, Bqkv, X, Qkv, Ctr, Ctr, pid, nprog, live, T, C, 3 * C,
                      HAS_QKV_B, False, False, False, False, 1, BM, BN_WIDE, BK, M_FAST)  # fmt: skip
    if (ph_lo <= 1) & (ph_hi > 2):
        _grid_sync(Sync, nprog, SPIN_LIMIT)
    if (ph_lo <= 2) & (ph_hi > 2):
        _attn_phase(Qkv, Att, Lse, CU, pid, nprog, T, B, J, H, D, qk_scale, 1 if CLS_ATTN else 0,
                    ATT_BM, ATT_BN, BLOCK_D)  # fmt: skip
    if (ph_lo <= 2) & (ph_hi > 3):
        _grid_sync(Sync, nprog, SPIN_LIMIT)
    if (ph_lo <= 3) & (ph_hi > 3):
        if CLS_ATTN:  # the cls tiles come first: programs past their count start on proj at once
            n_cls = (T + CLS_BN - 1) // CLS_BN
            for t in range(pid, n_cls, nprog):
                _cls_attn_tile(Qkv, Qkv, CU, Lse, Cls, Lse, CU, t * CLS_BN, T, B, H, D, qk_scale, 0, 0, 0, 0,
                               CLS_BN, BLOCK_D, False, CLS_HG)  # fmt: skip
            p3 = (pid - n_cls % nprog + nprog) % nprog
        else:
            p3 = pid
        _linear_phase(Att, Wproj, Bproj, Ls1, X, X1, Part, Ctr, p3, nprog, live, T, C, C,
                      HAS_PROJ_B, HAS_LS1, True, False, False, SPLIT_PROJ, BM, BN_NARROW, BK, M_FAST)  # fmt: skip
    if (ph_lo <= 3) & (ph_hi > 4):
        _grid_sync(Sync, nprog, SPIN_LIMIT)
    if (ph_lo <= 4) & (ph_hi > 4):
        _norm_phase(X1, Ln2W, Ln2B, Xn, pid, nprog, live, C, eps, NORM_ROWS, BLOCK_C)
    if (ph_lo <= 4) & (ph_hi > 5):
        _grid_sync(Sync, nprog, SPIN_LIMIT)
    if (ph_lo <= 5) & (ph_hi > 5):
        _linear_phase(Xn, Wfc1, Bfc1, Bfc1, X1, Hid, Ctr, Ctr, pid, nprog, live, T, C, F,
                      HAS_FC1_B, False, False, True, False, 1, BM, BN_WIDE, BK, M_FAST)  # fmt: skip
    if (ph_lo <= 5) & (ph_hi > 6):
        _grid_sync(Sync, nprog, SPIN_LIMIT)
    if (ph_lo <= 6) & (ph_hi > 6):
        _linear_phase(Hid, Wfc2, Bfc2, Ls2, X1, Y, Part, Ctr + max_tiles, pid, nprog, live, T, F, C,
                      HAS_FC2_B, HAS_LS2, True, False, True, SPLIT_FC2, BM, BN_NARROW, BK, M_FAST)  # fmt: skip
    _grid_exit(Sync, nprog)
