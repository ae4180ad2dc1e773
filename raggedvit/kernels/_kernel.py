"""Triton kernels of ragged attention (DESIGN.md section 2), shared by the torch op and the AOT build.

Layout: QKV [T, 3*H*D] (q | k | v, head-major), Out [T, H*D], Lse [H, T] fp32, ClsAttn [T] fp32,
CU [B+1] int32/int64. A query tile of the forward kernel holds up to BLOCK_M rows of one sequence: the grid has J
programs per sequence (J = cdiv(cdiv(T, B), BLOCK_M), set by the launchers), program (b, j) runs tiles j, j + J, ...
of sequence b, whose key loop runs that sequence's keys only; the programs past B * J zero the dead rows past cu[B].
Sequence b is [f(b), max(f(b), f(b+1))) with f(0) = 0, f(b) = clamp(CU[b], 0, T), and the dead rows are
[f(B), T): for a valid CU (cu[0] = 0, non-decreasing, cu[B] <= T) that is each sequence's rows exactly; for any other
CU every row of [0, T) still lies in at least one of them (sequence b ends at or past f(b+1), where b + 1 starts),
and every load and store is masked to [0, T): a bad CU never reads or writes out of bounds and leaves no row
unwritten, though rows covered twice then get either value (the CPU kernel rejects such a CU).

Relative position bias (HAS_POS, a constexpr: the kernels without it are unchanged): PosTable [H, R] fp32 and
TokPos [T] (CU's type) = each row's original token index; the bias of a (query, key) pair is
PosTable[h, rel(TokPos[q], TokPos[k])] (DESIGN.md section 1), added to the fp32 logits before the softmax. The
index is computed per pair from the two rows' grid coordinates: no [L, L] tensor; any TokPos value is either a
patch (p <= t < p + grid_h*grid_w) or a class row, so every table read is in [0, R).

Per-key bias (HAS_KEY_BIAS, a constexpr: the kernels without it are unchanged): KeyBias [T] fp32 is added to the
logit of every (query, key) pair by its key, in every head (ToMe's proportional attention: log(size)); the cls
kernel adds the same, so cls_attn is of the biased scores.

Lse units: log2 of the row's softmax denominator over scores already multiplied by scale*log2(e),
i.e. softmax(row)[k] = exp2(s_k * scale * log2(e) - Lse[h, row]).

Precision: fp16/bf16 use tensor-core dots with fp32 accumulation (P is rounded to the input dtype
before the PV dot, as in FlashAttention); fp32 inputs use input_precision="ieee" (no tf32) so the
fp32 path keeps fp32 accuracy.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

__all__ = ["_cls_attn_tile", "_fwd_tile", "_ragged_attn_fwd", "_ragged_cls_attn"]


# Reductions go through tl.reduce with tl.standard's own combine functions (the IR of tl.max /
# tl.min / tl.sum): the tl.standard wrappers themselves are plain JIT functions unless TRITON_INTERPRET
# was set when triton was first imported, which would break `load_interpreted_kernels()`; the
# interpreter maps these combine functions to numpy reductions.
@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b)


@triton.jit
def _min_combine(a, b):
    return tl.minimum(a, b)


@triton.jit
def _add_combine(a, b):
    return a + b


# True only in a copy of this module decorated under TRITON_INTERPRET (see _launch.load_interpreted_kernels):
# the interpreter multiplies bf16 tensors as their raw uint16 bits, so interpreted bf16 dots are upcast.
_INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes"))

# Key-loop shape, chosen by compiler version: Triton 3.8 (the AOT build) software-pipelines only a loop whose
# lower bound is a constant, so it gets `range(0, hi - lo)`; Triton 3.6 (the GPU machine's JIT) is faster with
# `range(lo, hi)`. The measurements behind this: DESIGN.md section 2, "Kernel choices".
_LOOP_FROM_ZERO = tl.constexpr(tuple(int(x) for x in triton.__version__.split(".")[:2]) >= (3, 7))

_max_fn = getattr(tl.standard, "_elementwise_max", _max_combine)
_min_fn = getattr(tl.standard, "_elementwise_min", _min_combine)
_add_fn = getattr(tl.standard, "_sum_combine", _add_combine)


@triton.jit
def _dot(a, b):
    """a [M, K] @ b [K, N] -> fp32 [M, N]; fp32 operands in full fp32 (no tf32)."""
    if a.dtype == tl.float32:
        c = tl.dot(a, b, input_precision="ieee")
    else:
        if _INTERPRETED:
            c = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        else:
            c = tl.dot(a, b)
    return c


@triton.jit
def _pos_split(TokPos, idx, ok, grid_h, grid_w, num_prefix):
    """idx [N] row indices -> (patch [N] int32 0/1, y [N] int32, x [N] int32) of each row's original token.

    A row is a patch row iff p <= t < p + grid_h*grid_w (compared in TokPos's type, so huge int64 values stay
    class rows); masked-off rows read t = -1 (a class row). Class rows get y = x = 0."""
    t = tl.load(TokPos + idx, mask=ok, other=-1)
    patch = (t >= num_prefix) & (t < num_prefix + grid_h * grid_w)
    rel = tl.where(patch, t - num_prefix, 0).to(tl.int32)
    y = rel // grid_w
    return patch.to(tl.int32), y, rel - y * grid_w


@triton.jit
def _seq_bounds(CU, rows, r_first, r_last, T, B, CHUNK: tl.constexpr, COARSE: tl.constexpr):
    """rows [R] int32 in [r_first, r_last] -> (start, end) [R] int32 of each row's sequence, in [0, T].

    start = max{cu[j] <= row}, end = min{cu[j] > row} (T if none), cu clamped to [0, T]: for a
    monotone cu that is [cu[b], cu[b+1]) of the row's sequence b, empty sequences included. No
    dependent load chain: a coarse pass loads every CHUNK-th cu entry as one vector (one load for
    B < CHUNK * COARSE, none for B < CHUNK) to find the chunks holding the tile's boundaries, then
    those chunks (usually one) are loaded as vectors and compared with all rows at once ([R, CHUNK]).
    A bad (non-monotone) cu gives wrong but in-range bounds; every load is masked.
    """
    n_coarse = B // CHUNK  # coarse entries c = 1..n_coarse are cu[c * CHUNK]
    c_first = r_first * 0
    c_last = r_first * 0
    end_dflt = T + r_first * 0
    for c0 in range(1, n_coarse + 1, COARSE):
        cs = c0 + tl.arange(0, COARSE)
        c_ok = cs <= n_coarse
        v = tl.load(CU + cs * CHUNK, mask=c_ok, other=0)
        v = tl.minimum(tl.maximum(v, 0), T).to(tl.int32)
        c_first += tl.reduce((c_ok & (v <= r_first)).to(tl.int32), 0, _add_fn)
        c_last += tl.reduce((c_ok & (v <= r_last)).to(tl.int32), 0, _add_fn)
        end_dflt = tl.minimum(end_dflt, tl.reduce(tl.where(c_ok & (v > r_last), v, T), 0, _min_fn))
    start = rows * 0
    end = rows * 0 + end_dflt
    for j0 in range(c_first * CHUNK, c_last * CHUNK + 1, CHUNK):
        js = j0 + tl.arange(0, CHUNK)
        j_ok = js <= B
        v = tl.load(CU + js, mask=j_ok, other=0)
        v = tl.minimum(tl.maximum(v, 0), T).to(tl.int32)
        below = j_ok[None, :] & (v[None, :] <= rows[:, None])
        start = tl.maximum(start, tl.reduce(tl.where(below, v[None, :], 0), 1, _max_fn))
        above = j_ok[None, :] & (v[None, :] > rows[:, None])
        end = tl.minimum(end, tl.reduce(tl.where(above, v[None, :], T), 1, _min_fn))
    return start, end


@triton.jit
def _fwd_tile(
    QKV, Out, Lse, PosTable, TokPos, KeyBias, rows, lo, hi, h, T, H, D, qk_scale, qb, vb, store_lse, grid_h, grid_w,
    num_prefix, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HAS_POS: tl.constexpr,
    HAS_KEY_BIAS: tl.constexpr,
):  # fmt: skip
    """Out[rows, h] (and Lse[h, rows] if store_lse) of one query tile: rows [BLOCK_M] in [lo, hi) are computed
    (keys [lo, hi)), the rest of the tile is masked off; qb [BLOCK_D] (q bias, QKV's dtype) and vb [BLOCK_D] fp32
    (v bias) are zeros without a bias; HAS_KEY_BIAS: KeyBias[key] is added to every logit of the key."""
    row_ok = rows < hi
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    row_stride = 3 * H * D
    head_off = h * D
    q_ptrs = QKV + rows.to(tl.int64)[:, None] * row_stride + head_off + offs_d[None, :]
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    q = q + qb[None, :]

    if HAS_POS:
        # pair index = q_base - k_off for patch/patch pairs, else R - 1 - q_patch - 2 * k_patch
        w2 = 2 * grid_w - 1
        R = (2 * grid_h - 1) * w2 + 3
        q_patch, yq, xq = _pos_split(TokPos, rows, row_ok, grid_h, grid_w, num_prefix)
        q_base = (yq + grid_h - 1) * w2 + xq + grid_w - 1
        q_cls = R - 1 - q_patch
        pos_row = PosTable + h * R

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, dtype=tl.float32)
    acc = tl.full([BLOCK_M, BLOCK_D], 0.0, dtype=tl.float32)
    if _LOOP_FROM_ZERO:
        n_lo = 0
        n_hi = hi - lo
    else:
        n_lo = lo
        n_hi = hi
    for start_n in range(n_lo, n_hi, BLOCK_N):
        cols = (start_n + lo - n_lo) + tl.arange(0, BLOCK_N)
        kv_mask = (cols < hi)[:, None] & d_ok[None, :]
        k_ptrs = QKV + cols.to(tl.int64)[:, None] * row_stride + (H * D + head_off) + offs_d[None, :]
        k = tl.load(k_ptrs, mask=kv_mask, other=0.0)
        s = _dot(q, tl.trans(k)) * qk_scale
        if HAS_POS:
            k_patch, yk, xk = _pos_split(TokPos, cols, cols < hi, grid_h, grid_w, num_prefix)
            both = (q_patch[:, None] & k_patch[None, :]) != 0
            idx = tl.where(both, q_base[:, None] - (yk * w2 + xk)[None, :], q_cls[:, None] - 2 * k_patch[None, :])
            s += tl.load(pos_row + idx) * 1.4426950408889634  # bias in log2 units; idx in [0, R) always
        if HAS_KEY_BIAS:
            s += (tl.load(KeyBias + cols, mask=cols < hi, other=0.0) * 1.4426950408889634)[None, :]  # log2 units
        s = tl.where((cols < hi)[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.reduce(s, 1, _max_fn))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no key yet: avoid inf - inf
        p = tl.math.exp2(s - m_use[:, None])
        alpha = tl.math.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.reduce(p, 1, _add_fn)
        v = tl.load(k_ptrs + H * D, mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v)
        m_i = m_new

    has_keys = l_i > 0.0
    out = tl.where(has_keys[:, None], acc / tl.where(has_keys, l_i, 1.0)[:, None] + vb[None, :], 0.0)
    o_ptrs = Out + rows.to(tl.int64)[:, None] * (H * D) + head_off + offs_d[None, :]
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    if store_lse != 0:
        lse = tl.where(has_keys, m_i + tl.math.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
        tl.store(Lse + h * T + rows, lse, mask=row_ok)


@triton.jit(do_not_specialize=["T", "B", "J", "scale_bits", "store_lse", "has_bias", "grid_h", "grid_w", "num_prefix"])
def _ragged_attn_fwd(
    QKV,
    Bias,
    CU,
    Out,
    Lse,
    PosTable,
    TokPos,
    KeyBias,
    T,
    B,
    J,
    H,
    D,
    scale_bits,
    store_lse,
    has_bias,
    grid_h,
    grid_w,
    num_prefix,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_POS: tl.constexpr,
    HAS_KEY_BIAS: tl.constexpr,
):
    """grid = (B * J + G, H), J >= 1, G >= 1 (launchers: J = cdiv(cdiv(T, B), BLOCK_M), G = cdiv(T, 4 * BLOCK_M)).
    Out[rows, h] = softmax(q k^T * scale + pos) v within each row's sequence; dead rows (past cu[B]): 0, Lse -inf.

    Program pid < B * J is (b, j) = divmod(pid, J): tiles j, j + J, ... of sequence b (one for sequences of at most
    J * BLOCK_M rows). The other G programs zero the dead rows [clamp(cu[B]), T) in BLOCK_M tiles, G apart.
    has_bias != 0: q, k, v are QKV + Bias [3*H*D] (the qkv Linear's bias): q + bq in QKV's dtype, the k bias
    cancels in the softmax, the v bias is added to the fp32 output. Lse is of the scores without the k bias.
    HAS_POS: pos = PosTable[h, rel(TokPos[q], TokPos[k])] (PosTable, TokPos, grid_h, grid_w, num_prefix unread
    otherwise); Lse includes it. HAS_KEY_BIAS: + KeyBias[k] [T] fp32 (unread otherwise); Lse includes it."""
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    n_seq = B * J  # programs of the sequences
    if pid_m < n_seq:
        qk_scale = scale_bits.to(tl.float32, bitcast=True) * 1.4426950408889634  # scale * log2(e)
        offs_d = tl.arange(0, BLOCK_D)
        # Bias: q gets its bias once; the k bias adds q.kb to every score of a row, which softmax cancels, so it is
        # never loaded; the v bias comes out of the weighted sum (the weights sum to 1) and is added to the output.
        # K and V tiles go to the dots exactly as loaded (an add in the key loop is slower: docs/decisions.md).
        b_ok = (offs_d < D) & (has_bias != 0)  # no bias: masked loads give exact zeros (x + 0 == x), no branch
        qb = tl.load(Bias + h * D + offs_d, mask=b_ok, other=0.0)
        vb = tl.load(Bias + 2 * H * D + h * D + offs_d, mask=b_ok, other=0.0).to(tl.float32)
        b = pid_m // J
        j = pid_m - b * J
        lo = tl.where(b == 0, 0, tl.minimum(tl.maximum(tl.load(CU + b), 0), T)).to(tl.int32)  # f(0) = 0
        hi = tl.maximum(lo, tl.minimum(tl.maximum(tl.load(CU + b + 1), 0), T).to(tl.int32))
        first = lo + j * BLOCK_M
        step = J * BLOCK_M
        for t in range(0, (tl.maximum(hi - first, 0) + step - 1) // step):  # no tl.cdiv: see the reductions above
            rows = first + t * step + tl.arange(0, BLOCK_M)
            _fwd_tile(QKV, Out, Lse, PosTable, TokPos, KeyBias, rows, lo, hi, h, T, H, D, qk_scale, qb, vb,
                      store_lse, grid_h, grid_w, num_prefix, BLOCK_M, BLOCK_N, BLOCK_D, HAS_POS,
                      HAS_KEY_BIAS)  # fmt: skip
    else:
        g = pid_m - n_seq
        n_dead = tl.num_programs(0) - n_seq
        dead = tl.where(B == 0, 0, tl.minimum(tl.maximum(tl.load(CU + B), 0), T)).to(tl.int32)  # f(B)
        offs_d = tl.arange(0, BLOCK_D)
        zeros = tl.full([BLOCK_M, BLOCK_D], 0.0, dtype=Out.dtype.element_ty)
        step = n_dead * BLOCK_M
        for t in range(0, (tl.maximum(T - dead - g * BLOCK_M, 0) + step - 1) // step):
            rows = dead + (g + t * n_dead) * BLOCK_M + tl.arange(0, BLOCK_M)
            row_ok = rows < T
            o_ptrs = Out + rows.to(tl.int64)[:, None] * (H * D) + h * D + offs_d[None, :]
            tl.store(o_ptrs, zeros, mask=row_ok[:, None] & (offs_d < D)[None, :])
            if store_lse != 0:
                tl.store(Lse + h * T + rows, tl.full([BLOCK_M], float("-inf"), dtype=tl.float32), mask=row_ok)


@triton.jit
def _cls_attn_tile(
    QKV, Bias, CU, Lse, ClsAttn, PosTable, TokPos, KeyBias, r_first, T, B, H, D, qk_scale, has_bias, grid_h,
    grid_w, num_prefix, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HAS_POS: tl.constexpr, HG: tl.constexpr,
    HAS_KEY_BIAS: tl.constexpr,
):  # fmt: skip
    """ClsAttn[r_first : r_first + BLOCK_N] (masked to [0, T)) as `_ragged_cls_attn` defines it; qk_scale = scale *
    log2(e). Shared by `_ragged_cls_attn` and the block engine."""
    cols = r_first + tl.arange(0, BLOCK_N)
    col_ok = cols < T
    start, end = _seq_bounds(CU, cols, r_first, r_first + BLOCK_N - 1, T, B, 4096 // BLOCK_N, 64)
    live = tl.minimum(tl.maximum(tl.load(CU + B), 0), T)  # rows >= cu[B] are dead: cls_attn 0
    ok = col_ok & (cols >= start) & (cols < end) & (cols < live)  # token lies inside its (clamped) sequence
    offs_d = tl.arange(0, BLOCK_D)
    offs_g = tl.arange(0, HG)
    row_stride = 3 * H * D
    # [BLOCK_N, 1, 1] row bases, [1, HG, BLOCK_D] in-row offsets
    q_rows = QKV + start.to(tl.int64)[:, None, None] * row_stride
    k_rows = QKV + cols.to(tl.int64)[:, None, None] * row_stride + H * D
    lse_rows = Lse + start[:, None]
    if HAS_POS:
        w2 = 2 * grid_w - 1
        R = (2 * grid_h - 1) * w2 + 3
        q_patch, yq, xq = _pos_split(TokPos, start, ok, grid_h, grid_w, num_prefix)
        k_patch, yk, xk = _pos_split(TokPos, cols, ok, grid_h, grid_w, num_prefix)
        both = (q_patch & k_patch) != 0
        pos_idx = tl.where(both, (yq - yk + grid_h - 1) * w2 + xq - xk + grid_w - 1, R - 1 - q_patch - 2 * k_patch)
    if HAS_KEY_BIAS:  # the token is the key: its bias, in log2 units, in every head
        key_bias = tl.load(KeyBias + cols, mask=ok, other=0.0) * 1.4426950408889634
    acc = tl.full([BLOCK_N], 0.0, dtype=tl.float32)
    for h0 in range(0, H, HG):
        heads = h0 + offs_g
        h_ok = heads < H
        offs = heads[None, :, None] * D + offs_d[None, None, :]
        mask = ok[:, None, None] & h_ok[None, :, None] & (offs_d < D)[None, None, :]
        # scores as _ragged_attn_fwd computes them (its Lse must match): q + bq in QKV's dtype, no k bias
        bmask = (h_ok[None, :, None] & (offs_d < D)[None, None, :]) & (has_bias != 0)
        q = (tl.load(q_rows + offs, mask=mask, other=0.0) + tl.load(Bias + offs, mask=bmask, other=0.0)).to(tl.float32)
        k = tl.load(k_rows + offs, mask=mask, other=0.0).to(tl.float32)
        lse = tl.load(lse_rows + heads[None, :] * T, mask=ok[:, None] & h_ok[None, :], other=0.0)
        s = tl.reduce(q * k, 2, _add_fn) * qk_scale  # [BLOCK_N, HG]
        if HAS_POS:
            pos = tl.load(PosTable + heads[None, :] * R + pos_idx[:, None], mask=h_ok[None, :], other=0.0)
            s += pos * 1.4426950408889634
        if HAS_KEY_BIAS:
            s += key_bias[:, None]
        p = tl.where(ok[:, None] & h_ok[None, :], tl.math.exp2(s - lse), 0.0)
        acc += tl.reduce(p, 1, _add_fn)
    tl.store(ClsAttn + cols, acc / H, mask=col_ok)


@triton.jit(do_not_specialize=["T", "B", "scale_bits", "has_bias", "grid_h", "grid_w", "num_prefix"])
def _ragged_cls_attn(
    QKV,
    Bias,
    CU,
    Lse,
    ClsAttn,
    PosTable,
    TokPos,
    KeyBias,
    T,
    B,
    H,
    D,
    scale_bits,
    has_bias,
    grid_h,
    grid_w,
    num_prefix,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_POS: tl.constexpr,
    HG: tl.constexpr,
    HAS_KEY_BIAS: tl.constexpr,
):
    """grid = (cdiv(T, BLOCK_N),). ClsAttn[t] = mean_h softmax(row cu[b])[t] for token t of sequence b.

    Needs Lse [H, T] of the sequences' first rows from _ragged_attn_fwd(store_lse=1). Deterministic.
    Heads are processed HG at a time as [BLOCK_N, HG, BLOCK_D] tiles (HG: the launch config's cls_heads,
    `_config.py`). HAS_POS: the scores get the same position bias as in _ragged_attn_fwd (query = the sequence's
    first row, key = the token); HAS_KEY_BIAS: the same key bias (KeyBias[token]).
    """
    qk_scale = scale_bits.to(tl.float32, bitcast=True) * 1.4426950408889634  # scale * log2(e)
    _cls_attn_tile(QKV, Bias, CU, Lse, ClsAttn, PosTable, TokPos, KeyBias, tl.program_id(0) * BLOCK_N, T, B, H, D,
                   qk_scale, has_bias, grid_h, grid_w, num_prefix, BLOCK_N, BLOCK_D, HAS_POS, HG,
                   HAS_KEY_BIAS)  # fmt: skip


@triton.jit(do_not_specialize=["T", "B"])
def _seq_bounds_probe(
    CU, Start, End, T, B, BLOCK: tl.constexpr, CHUNK: tl.constexpr, COARSE: tl.constexpr
):  # fmt: skip
    """Test hook: Start/End [T] int32 = _seq_bounds of every row, tiles of BLOCK rows (grid cdiv(T, BLOCK))."""
    r_first = tl.program_id(0) * BLOCK
    rows = r_first + tl.arange(0, BLOCK)
    start, end = _seq_bounds(CU, rows, r_first, r_first + BLOCK - 1, T, B, CHUNK, COARSE)
    tl.store(Start + rows, start, mask=rows < T)
    tl.store(End + rows, end, mask=rows < T)
