"""Triton kernel of one tome stage's merge (`com.raggedvit::RaggedMerge`, `raggedvit.pruning.merge`: the semantics
are `merge_tokens_reference`'s), shared by the torch op's CUDA path (JIT) and the AOT build.

One program per image (grid (B,)), image b = rows [b*n, (b+1)*n) of X / QKV / Size (T = B*n; CU is never read).
With has_skip, the rows merged are X + (Skip + SkipBias) (`merge.residual_rows`: each sum in float32, rounded to x's
dtype; SkipBias only with has_skip_bias), formed wherever a row of X is read.
Set A = positions a0, a0+2, ... (n_A rows), set B = b0, b0+2, ... (n_B rows) after the p prefix rows
(`merge_sets`); r_eff = min(r, (n - p) // 2) rows merge; m = n - r_eff rows come out. Steps, all in one program:

1. Matching: the metric of a row is the k part of its qkv (+ the k part of Bias) in float32, summed over the H heads
   in head order and divided by H (the reference's mean), then divided by max(||m||_2, 1e-12) (sqrt and divisions
   rounded to nearest, as torch's). Scores = A metric x B metric^T by `tl.dot(input_precision="ieee")` (fp32 FMA,
   no TF32) in BLOCK_A x BLOCK_B tiles (any n_B; A tiles up to the padded width NP). Each A row keeps its best B row:
   the largest score (floats compared as ordered int32 keys: -0 = +0, NaN above +inf like torch's max), the lowest
   B index on ties (B tiles in ascending order, strict >, the lowest index within a tile).
2. Order: each A row's key packed into an int64 `key << 32 | (65535 - a) << 16 | best` (distinct: larger = ahead;
   the best B index rides along) and sorted descending (tl.sort over the NP lanes): sorted lane k holds the A row of
   rank k (rank_i = #{j: s_j > s_i or (s_j == s_i and j < i)}: the stable descending order). The r_eff first lanes
   merge; an A row merges iff its packed value >= the one at lane r_eff - 1. Hence n_A <= NP <= 65536.
3. Outputs per image, at rows b*m + slot: the p prefix rows (slot = position); the kept A rows, in position order
   with a class token (slot = p + kept rows before it, a cumulative sum) or in rank order without one (slot =
   p + rank - r_eff); then every B row (slot = p + n_A - r_eff + its B index). Prefix and kept rows are copied
   (x unchanged, size, src = b*n + position, key_bias = log(size)). A B row that no A row merges into is
   (x_B * s_B + 0) / s_B (a stream of [BLOCK_B, BLOCK_C] tiles); a B row that merged rows go to is
   (x_B * s_B + sum_k s_k x_k) / (s_B + sum_k s_k), computed once per destination (its first merged row in rank
   order) from [BLOCK_M, BLOCK_M] weight matrices (W[u, k] = s_k where merged rows u and k share the destination)
   times the chunks of BLOCK_M merged rows, chunks in rank order, summed in float32 by
   `tl.dot(input_precision="ieee")`: r_eff^2 * C FMAs, no atomics (the same input gives the same bits); divided once
   (rounded to nearest) and rounded to x's dtype once. Score[b*n_A + a] = row a's best score (-inf without a B row).
   CuOut[b+1] = (b+1)*m (program 0 also writes CuOut[0] = 0).

Tunables (the JIT launch and the AOT plan both read them): MERGE_WIDTHS (NP, num_warps), MERGE_HEAD_DIMS (BLOCK_D),
the tile sizes below, and MERGE_ROW_BYTES (BLOCK_C = MERGE_ROW_BYTES / x's element size). Runtime ints: n, C, H, Dh,
num_prefix, r, has_bias, has_size, has_skip, has_skip_bias, class_token. Constexpr: NP, BLOCK_D and the tiles (and
x's dtype).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = [
    "MERGE_BLOCK_A",
    "MERGE_BLOCK_B",
    "MERGE_BLOCK_M",
    "MERGE_BLOCK_ROWS",
    "MERGE_HEAD_DIMS",
    "MERGE_MAX_LANE",
    "MERGE_ROW_BYTES",
    "MERGE_WIDTHS",
    "_ragged_merge",
    "merge_block_c",
    "merge_head_block",
    "merge_launch_config",
]

# (NP, num_warps): the compiled padded widths of set A (per-row vectors and the sort hold NP lanes). The launch takes
# the smallest NP >= n_A; wider images are refused (n_A > 2048: n > 4097 rows with one prefix row).
MERGE_WIDTHS = ((128, 8), (512, 8), (2048, 16))
MERGE_HEAD_DIMS = (64, 128)  # BLOCK_D of the compiled variants: the smallest >= Dh
MERGE_BLOCK_A = 64  # A rows per score tile (divides every NP)
MERGE_BLOCK_B = 32  # B rows per score tile and per tile of the B rows nothing merges into
MERGE_BLOCK_M = 16  # merged rows per weight-matrix chunk (tl.dot's M and K: >= 16)
MERGE_BLOCK_ROWS = 64  # rows per copy tile (prefix and kept rows; divides every NP)
MERGE_ROW_BYTES = 256  # bytes of x per row and column tile: BLOCK_C = 128 (fp16 / bf16) or 64 (fp32)
MERGE_MAX_LANE = 65536  # the packed sort key holds A and B indices in 16 bits each

_NONE = tl.constexpr(-(2**63))  # packed key of a lane past n_A: after every A row
_NEG_INF_KEY = tl.constexpr(-2139095041)  # ordered key of -inf (bits 0xFF800000 ^ 0x7FFFFFFF)
_NO_KEY = tl.constexpr(-(2**31))  # key of a B column past n_B: below -inf


def merge_head_block(head_dim: int) -> int:
    """BLOCK_D for a head dim: the smallest MERGE_HEAD_DIMS entry >= head_dim, 0 when none is (AOT); the JIT launch
    may use any power of two (`merge_launch_config`)."""
    return next((d for d in MERGE_HEAD_DIMS if head_dim <= d), 0)


def merge_block_c(itemsize: int) -> int:
    """BLOCK_C (columns per copy / average tile) for x's element size in bytes."""
    return MERGE_ROW_BYTES // itemsize


def merge_launch_config(n_a: int) -> tuple[int, int]:
    """(NP, num_warps) of the launch for n_A rows of set A: the smallest MERGE_WIDTHS entry with NP >= n_A (the
    rule the C++ launcher applies); ValueError when n_A is above the widest."""
    for np_, warps in MERGE_WIDTHS:
        if n_a <= np_:
            return np_, warps
    raise ValueError(f"RaggedMerge: n_A = {n_a} rows of set A exceed the widest compiled width {MERGE_WIDTHS[-1][0]}")


@triton.jit
def _order_key(s):
    """Ordered int32 key of float32 s: -0 = +0, NaN above +inf (torch's max and sort treat NaN as the largest)."""
    s = s + 0.0  # -0 -> +0
    bits = s.to(tl.int32, bitcast=True)
    key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return tl.where(s != s, 0x7FFFFFFF, key)


@triton.jit
def _key_value(key):
    """The float32 of an ordered key (NaN's key gives a NaN)."""
    return tl.where(key < 0, key ^ 0x7FFFFFFF, key).to(tl.float32, bitcast=True)


@triton.jit
def _metric(QKV, Bias, row0, pos, valid, H, Dh, has_bias, ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """Normalised metric [ROWS, BLOCK_D] fp32 of rows row0 + pos (valid mask; other rows and columns 0): the k
    part of qkv (+ bias), summed over heads in order, / H, / max(norm, 1e-12)."""
    d = tl.arange(0, BLOCK_D)
    dm = d < Dh
    hd = H * Dh
    rows = (row0 + pos).to(tl.int64)
    ptrs = QKV + rows[:, None] * (3 * hd) + (hd + d)[None, :]
    mask = valid[:, None] & dm[None, :]
    bmask = dm & (has_bias != 0)
    acc = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
    for h in range(0, H):
        k = tl.load(ptrs + h * Dh, mask=mask, other=0.0).to(tl.float32)
        bias = tl.load(Bias + hd + h * Dh + d, mask=bmask, other=0.0).to(tl.float32)
        acc += k + bias[None, :]
    m = tl.div_rn(acc, tl.zeros_like(acc) + H.to(tl.float32))
    norm = tl.maximum(tl.sqrt_rn(tl.sum(m * m, axis=1)), 1e-12)
    return tl.div_rn(m, norm[:, None] + tl.zeros_like(m))


@triton.jit
def _rows(X, Skip, SkipBias, rows, c, mask, C, has_skip, has_skip_bias):
    """Rows `rows` [R] (int64), columns c [BLOCK_C] of the rows merged, in x's dtype (masked entries 0): X, or
    X + (Skip + SkipBias) with each sum in float32 rounded to x's dtype (`merge.residual_rows`)."""
    offs = rows[:, None] * C + c[None, :]
    v = tl.load(X + offs, mask=mask, other=0.0)
    if has_skip != 0:
        branch = tl.load(Skip + offs, mask=mask, other=0.0)
        if has_skip_bias != 0:
            bias = tl.load(SkipBias + c, mask=c < C, other=0.0).to(tl.float32)
            branch = (branch.to(tl.float32) + bias[None, :]).to(X.dtype.element_ty)
        v = (v.to(tl.float32) + branch.to(tl.float32)).to(X.dtype.element_ty)
    return v


@triton.jit
def _lanes(vec, t, NP: tl.constexpr, BLOCK: tl.constexpr):
    """Lanes t*BLOCK .. t*BLOCK + BLOCK - 1 of the [NP] vector vec (a masked sum over its [NP // BLOCK, BLOCK]
    view: one nonzero term per lane, exact for ints)."""
    tiles = tl.arange(0, NP // BLOCK)
    view = tl.reshape(vec, [NP // BLOCK, BLOCK])
    return tl.sum(tl.where(tiles[:, None] == t, view, 0), axis=0)


@triton.jit
def _copy_rows(X, Skip, SkipBias, XOut, Size, SizeOut, Src, KeyBias, row0, out0, pos, slot, active, C, has_size,
               has_skip, has_skip_bias, BLOCK_C: tl.constexpr):  # fmt: skip
    """Copies rows row0 + pos of the rows merged (`_rows`) to rows out0 + slot of XOut (active lanes), with their
    size, src and key_bias = log(size)."""
    src = (row0 + pos).to(tl.int64)
    dst = (out0 + slot).to(tl.int64)
    cols = tl.arange(0, BLOCK_C)
    for c0 in range(0, C, BLOCK_C):
        c = c0 + cols
        mask = active[:, None] & (c < C)[None, :]
        v = _rows(X, Skip, SkipBias, src, c, mask, C, has_skip, has_skip_bias)
        tl.store(XOut + dst[:, None] * C + c[None, :], v, mask=mask)
    size = tl.load(Size + src, mask=active & (has_size != 0), other=1.0)
    tl.store(SizeOut + dst, size, mask=active)
    tl.store(Src + dst, src, mask=active)
    tl.store(KeyBias + dst, tl.log(size), mask=active)


@triton.jit
def _merged_chunk(srt, t, r_eff, Size, row0, a0, has_size, NP: tl.constexpr, BLOCK_M: tl.constexpr):
    """Merged rows of rank t*BLOCK_M .. t*BLOCK_M + BLOCK_M - 1 (< r_eff): (their B index, size, x row position,
    valid mask)."""
    v = _lanes(srt, t, NP, BLOCK_M)
    k = t * BLOCK_M + tl.arange(0, BLOCK_M)
    ok = k < r_eff
    a = (65535 - ((v >> 16) & 65535)).to(tl.int32)
    dst = tl.where(ok, (v & 65535).to(tl.int32), -1)
    pos = tl.where(ok, a0 + 2 * a, 0)
    s = tl.load(Size + row0 + pos, mask=ok & (has_size != 0), other=1.0)
    return dst, s, pos, ok


# C and Dh stay specialised (multiples of 16: aligned rows, vector loads; the AOT build hints both and the C++ launcher
# requires them); n changes from block to block and the rest are flags
@triton.jit(do_not_specialize=["n", "H", "num_prefix", "r", "has_bias", "has_size", "has_skip", "has_skip_bias",
                                "class_token"])  # fmt: skip
def _ragged_merge(
    X, QKV, Bias, Size, Skip, SkipBias, XOut, SizeOut, CuOut, Src, KeyBias, Score, n, C, H, Dh, num_prefix, r,
    has_bias, has_size, has_skip, has_skip_bias, class_token, NP: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_ROWS: tl.constexpr,
    BLOCK_C: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    p = num_prefix
    a0 = p + p % 2
    b0 = p + 1 - p % 2
    n_a = tl.maximum(n - a0 + 1, 0) // 2
    n_b = tl.maximum(n - b0 + 1, 0) // 2
    r_eff = tl.minimum(tl.maximum(r, 0), tl.maximum(n - p, 0) // 2)
    m = n - r_eff
    row0 = b * n  # first input row of the image
    out0 = b * m  # first output row
    tl.store(CuOut + b + 1, (b + 1).to(tl.int64) * m)
    if b == 0:
        tl.store(CuOut, (b * 0).to(tl.int64))

    # 1. matching: each A row's best score (ordered key) and B index, in [NP // BLOCK_A, BLOCK_A] tiles
    NT: tl.constexpr = NP // BLOCK_A
    tiles = tl.arange(0, NT)
    ua = tl.arange(0, BLOCK_A)
    ub = tl.arange(0, BLOCK_B)
    best_key = tl.full([NT, BLOCK_A], _NEG_INF_KEY, tl.int32)
    best_idx = tl.zeros([NT, BLOCK_A], dtype=tl.int32)
    for ta in range(0, tl.cdiv(n_a, BLOCK_A)):
        ia = ta * BLOCK_A + ua
        ma = _metric(QKV, Bias, row0, a0 + 2 * ia, ia < n_a, H, Dh, has_bias, BLOCK_A, BLOCK_D)
        tkey = tl.full([BLOCK_A], _NEG_INF_KEY, tl.int32)
        tidx = tl.zeros([BLOCK_A], dtype=tl.int32)
        for tb in range(0, tl.cdiv(n_b, BLOCK_B)):
            jb = tb * BLOCK_B + ub
            vb = jb < n_b
            mb = _metric(QKV, Bias, row0, b0 + 2 * jb, vb, H, Dh, has_bias, BLOCK_B, BLOCK_D)
            s = tl.dot(ma, tl.trans(mb), input_precision="ieee")  # [BLOCK_A, BLOCK_B] cosine similarities
            key = tl.where(vb[None, :], _order_key(s), _NO_KEY)
            kmax = tl.max(key, axis=1)
            kidx = tl.min(tl.where(key == kmax[:, None], jb[None, :], 2147483647), axis=1)
            better = kmax > tkey  # strict: an equal score in a later tile keeps the lower B index
            tkey = tl.where(better, kmax, tkey)
            tidx = tl.where(better, kidx, tidx)
        here = tiles[:, None] == ta
        best_key = tl.where(here, tkey[None, :], best_key)
        best_idx = tl.where(here, tidx[None, :], best_idx)

    # 2. order: packed keys sorted descending; lane k of srt = the A row of rank k
    lane = tl.arange(0, NP)
    valid = lane < n_a
    keys = tl.reshape(best_key, [NP])
    best = tl.reshape(best_idx, [NP])
    tl.store(Score + b.to(tl.int64) * n_a + lane, _key_value(keys), mask=valid)
    low = (65535 - lane).to(tl.int64) * 65536 + best.to(tl.int64)
    packed = tl.where(valid, keys.to(tl.int64) * 4294967296 + low, _NONE)
    srt = tl.sort(packed, descending=True)
    kth = tl.sum(tl.where(lane == r_eff - 1, srt, 0), axis=0)  # the last merged row (r_eff >= 1)
    merged = valid & (r_eff > 0) & (packed >= kth)
    kept = (valid & ~merged).to(tl.int32)
    n_kept = n_a - r_eff
    # kept A rows as lanes (A index, output slot, active): position order (class token) or rank order
    a_sorted = (65535 - ((srt >> 16) & 65535)).to(tl.int32)
    ct = class_token != 0
    a_lane = tl.where(ct, lane, a_sorted)
    slot_lane = tl.where(ct, p + tl.cumsum(kept, axis=0) - kept, p + lane - r_eff)
    act_lane = tl.where(ct, kept != 0, (lane >= r_eff) & valid).to(tl.int32)

    # 3. outputs: prefix rows, kept A rows, B rows
    ur = tl.arange(0, BLOCK_ROWS)
    for t0 in range(0, p, BLOCK_ROWS):
        i = t0 + ur
        _copy_rows(X, Skip, SkipBias, XOut, Size, SizeOut, Src, KeyBias, row0, out0, i, i, i < p, C, has_size,
                   has_skip, has_skip_bias, BLOCK_C)  # fmt: skip
    for t in range(0, tl.cdiv(n_a, BLOCK_ROWS)):
        a = _lanes(a_lane, t, NP, BLOCK_ROWS)
        slot = _lanes(slot_lane, t, NP, BLOCK_ROWS)
        act = _lanes(act_lane, t, NP, BLOCK_ROWS) != 0
        _copy_rows(X, Skip, SkipBias, XOut, Size, SizeOut, Src, KeyBias, row0, out0, tl.where(act, a0 + 2 * a, 0),
                   slot, act, C, has_size, has_skip, has_skip_bias, BLOCK_C)  # fmt: skip
    # B rows that no A row merges into: x_B * s_B / s_B, a stream
    cols = tl.arange(0, BLOCK_C)
    n_chunks = tl.cdiv(r_eff, BLOCK_M)
    for tb in range(0, tl.cdiv(n_b, BLOCK_B)):
        jb = tb * BLOCK_B + ub
        hit = tl.zeros([BLOCK_B], dtype=tl.int32)
        for tm in range(0, n_chunks):
            to, _, _, _ = _merged_chunk(srt, tm, r_eff, Size, row0, a0, has_size, NP, BLOCK_M)
            hit += tl.sum((to[None, :] == jb[:, None]).to(tl.int32), axis=1)
        plain = (jb < n_b) & (hit == 0)
        src = (row0 + tl.where(plain, b0 + 2 * jb, 0)).to(tl.int64)
        dst = (out0 + p + n_kept + jb).to(tl.int64)
        s_b = tl.load(Size + src, mask=plain & (has_size != 0), other=1.0)
        for c0 in range(0, C, BLOCK_C):
            c = c0 + cols
            mask = plain[:, None] & (c < C)[None, :]
            xb = _rows(X, Skip, SkipBias, src, c, mask, C, has_skip, has_skip_bias).to(tl.float32)
            out = tl.div_rn(xb * s_b[:, None] + 0.0, s_b[:, None] + tl.zeros_like(xb))  # + 0.0: as x_B s_B + 0
            tl.store(XOut + dst[:, None] * C + c[None, :], out.to(XOut.dtype.element_ty), mask=mask)
        tl.store(SizeOut + dst, s_b, mask=plain)
        tl.store(Src + dst, src, mask=plain)
        tl.store(KeyBias + dst, tl.log(s_b), mask=plain)
    # B rows that merged rows go to: one lane per destination (its first merged row in rank order), the sums of
    # every merged row with that destination, chunk by chunk in rank order: [BLOCK_M, BLOCK_M] weights x their rows
    um = tl.arange(0, BLOCK_M)
    for tc in range(0, n_chunks):
        to_c, _, _, ok_c = _merged_chunk(srt, tc, r_eff, Size, row0, a0, has_size, NP, BLOCK_M)
        k_c = tc * BLOCK_M + um
        first = ok_c
        s_m = tl.zeros([BLOCK_M], dtype=tl.float32)  # sizes merged into each lane's destination, in rank order
        for tv in range(0, n_chunks):
            to_v, s_v, _, ok_v = _merged_chunk(srt, tv, r_eff, Size, row0, a0, has_size, NP, BLOCK_M)
            same = (to_v[None, :] == to_c[:, None]) & ok_v[None, :]
            earlier = same & ((tv * BLOCK_M + um)[None, :] < k_c[:, None])
            first = first & (tl.sum(earlier.to(tl.int32), axis=1) == 0)
            s_m += tl.sum(tl.where(same, s_v[None, :], 0.0), axis=1)
        src = (row0 + tl.where(first, b0 + 2 * to_c, 0)).to(tl.int64)
        dst = (out0 + p + n_kept + tl.where(first, to_c, 0)).to(tl.int64)
        s_b = tl.load(Size + src, mask=first & (has_size != 0), other=1.0)
        size_b = s_b + s_m
        for c0 in range(0, C, BLOCK_C):
            c = c0 + cols
            cm = c < C
            acc = tl.zeros([BLOCK_M, BLOCK_C], dtype=tl.float32)
            for tv in range(0, n_chunks):
                to_v, s_v, pos_v, ok_v = _merged_chunk(srt, tv, r_eff, Size, row0, a0, has_size, NP, BLOCK_M)
                w = tl.where((to_v[None, :] == to_c[:, None]) & ok_v[None, :], s_v[None, :], 0.0)
                rows_v = (row0 + pos_v).to(tl.int64)
                xv = _rows(X, Skip, SkipBias, rows_v, c, ok_v[:, None] & cm[None, :], C, has_skip, has_skip_bias)
                xv = xv.to(tl.float32)
                acc = tl.dot(w, xv, acc, input_precision="ieee")
            mask = first[:, None] & cm[None, :]
            xb = _rows(X, Skip, SkipBias, src, c, mask, C, has_skip, has_skip_bias).to(tl.float32)
            out = tl.div_rn(xb * s_b[:, None] + acc, size_b[:, None] + tl.zeros_like(acc))
            tl.store(XOut + dst[:, None] * C + c[None, :], out.to(XOut.dtype.element_ty), mask=mask)
        tl.store(SizeOut + dst, size_b, mask=first)
        tl.store(Src + dst, src, mask=first)
        tl.store(KeyBias + dst, tl.log(size_b), mask=first)
