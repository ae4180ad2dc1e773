"""Triton kernels of the ragged linear layer, shared by the torch op (JIT) and the AOT build (DESIGN.md section 2).

Y[r] = act(X[r] @ W^T + Bias) + Res[r] for the live rows r < live, where live = clamp(CU[B], 0, T) when has_live
(the capacity layout's device-side count), else T; the dead rows r >= live are unspecified (no consumer reads
them: DESIGN.md section 4). Two kernels: `_ragged_linear` (pointer loads; every arch) never writes a dead row;
`_ragged_linear_tma` (Hopper's tensor memory accelerator, a persistent grid; `_linear_config.linear_config` picks it
on sm_90 from LARGE_T rows) never writes a tile of dead rows, and writes the dead rows of the last live tile (whole
tiles go out through TMA stores).

Layout (row-major, contiguous): X [T, K], W [N, K] (nn.Linear's weight), Bias [N], Res [T, N], Y [T, N] in one dtype
(fp16 / bf16 / fp32), CU [B+1] int32 or int64. activation: 0 none, 1 GELU (erf). `_ragged_linear`: a program owns
one BLOCK_M x BLOCK_N tile of Y (grouped ordering over GROUP_M row tiles for L2 reuse of W); a tile whose first row
is at or past `live` returns at once (no load, no store), so the GPU time of a capacity layout follows its live
rows. Every load is masked: any CU value, T, N, K >= 1 are safe. fp32 inputs use input_precision="ieee" (no tf32).
Grid: (cdiv(T, BLOCK_M) * cdiv(N, BLOCK_N),). `_ragged_linear_tma` (fp16 / bf16, 16-byte aligned rows): its own
comment below; grid (min(programs_per_sm * SMs, cdiv(T, BLOCK_M) * cdiv(N, BLOCK_N)),).

GELU of `_bias_gelu` (`gelu_erf`): GELU(x) = x * Phi(x), Phi(x) =
erfc(-x / sqrt 2) / 2, with e = erfc(|x| / sqrt 2) / 2 from Numerical Recipes' Chebyshev form `erfcc`
(t = 1 / (1 + z/2), e = t exp(P(t) - z^2) / 2, fractional error below 1.2e-7 for every z >= 0) and Phi = e for
x < 0, 1 - e else: one reciprocal, one exp, ten FMAs, no branch. The exp runs in log2 units with log2(e) and the
1/2 folded into P's coefficients, and the reciprocal and exp2 are the hardware approximations (rcp.approx,
ex2.approx: one MUFU instruction each, the exp2 keeping subnormal results), which cut the kernel's instructions per
element by about a quarter against Triton's division and exp (the kernel is issue-bound, not memory-bound:
docs/decisions.md). In fp32 arithmetic the relative error is below
2e-6 for x >= -4 (|GELU| >= 1.3e-4) and grows as x^2 further out (the exp's argument -z^2): below 1e-5 with exact
exp (the interpreter), below 2e-6 + 2^-22 x^2 with the GPU's approximate exp2 (2.1e-5 at x = -11.4, where
|GELU| ~ 1e-29); results under float32's smallest normal flush to 0 on the GPU. Against
x (1 + erf(x / sqrt 2)) / 2 with libdevice's erff it keeps the negative tail's relative accuracy (no 1 + erf
cancellation); over every finite fp16 x its fp16-rounded result is the exactly rounded GELU in all but a handful of
inputs (1 ulp off), where the fp32 erf form misses hundreds (tests/kernels/test_bias_gelu.py); and the kernel below
runs faster with it than with libdevice's erff at the shipped 8 x 512 config (docs/decisions.md).
`_ragged_linear_tma`'s GELU epilogue is `gelu_poly` (fp16 / bf16 outputs only): it is the kernel of launches from
LARGE_T rows on sm_90, where the epilogue is issue-bound and fc1's GELU cost about as much as its K loop. gelu_poly
takes one MUFU operation per element (a flushing ex2) against two (rcp, and an ex2 that keeps subnormals, a few
more instructions in SASS), and 18 other PTX instructions against 19 (an elementwise kernel compiled for sm_90):
Phi(-a) = exp2(P(min(a, 6)) - a^2 log2(e) / 2) for a = |x|, P a degree-10 polynomial fit of log2 Phi(-a) + a^2
log2(e) / 2 on [0, 6] (Chebyshev nodes), and GELU(x) = max(x, 0) - |x| Phi(-|x|). Its relative error is below 5e-6
for x >= -6 (float32 arithmetic; the quadratic term is exact past 6, P is not: for x < -6, where |GELU(x)| < 6e-9,
the result is within a factor 2.2 of the exact one); over every finite fp16 x its fp16-rounded result is the
exactly rounded GELU but for 14 inputs, each 1 ulp off (float32 arithmetic with an exact exp2, as the interpreter
runs it: tests/kernels/test_bias_gelu.py, +0 and -0 taken as equal); inf -> inf, -inf -> 0, nan -> nan. It makes
the fc1 GEMMs faster than gelu_erf does (docs/decisions.md).
`_ragged_linear`'s GELU keeps the erf form the exports were validated with (`raggedvit validate` runs one image at
a time, 197 rows: the pointer kernel): with gelu_erf there, the fp16-all cls-mass capacity export with the dead-row
RaggedLinear (deit_base, seeded) swapped one token of the astronaut sample photo at block 9, where the reference's
score gap is 7.0e-4 (under 4 fp16 ulps), and `raggedvit validate --device cuda` failed on it (docs/decisions.md):
the validator judges a same-count token swap by its logits (DESIGN.md
section 6). Each of the three GELUs is within rounding of the exact one.

`_bias_gelu` (com.raggedvit::BiasGelu): Y[m, n] = GELU(X[m, n] + Bias[n]) (Bias optional), X / Y [M, N] row-major
contiguous in one dtype (fp16 / bf16 / fp32), Bias [N] in that dtype; the sum and GELU in fp32, one rounding. A
program owns a BLOCK_M x BLOCK_N tile, every access masked (any M, N >= 1). Grid: (cdiv(M, BLOCK_M) * cdiv(N,
BLOCK_N),). Over deit's fc1 outputs it streams more elements a second than ONNX Runtime's BiasGelu
(docs/decisions.md).
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

__all__ = ["_bias_gelu", "_ragged_linear", "_ragged_linear_tma", "_tma_epilogue", "gelu_erf", "gelu_poly"]


# True in a process started with TRITON_INTERPRET (the interpreter runs no inline PTX: `_rcp` divides there)
_INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes"))

# Numerical Recipes' erfcc: erfc(z) = t exp(P(t) - z^2), t = 1 / (1 + z/2), P(t) = sum_k _ERFCC[k] t^(9-k).
_ERFCC = (0.17087277, -0.82215223, 1.48851587, -1.13520398, 0.27886807, -0.18628806, 0.09678418, 0.37409196,
          1.00002368, -1.26551223)  # fmt: skip
_LOG2E = 1.4426950408889634
# P in log2 units with Phi's 1/2 folded into the constant term: erfc(z) / 2 = t exp2(Q(t) - z^2 log2(e)),
# Q(t) = log2(e) P(t) - 1 (the exp's scale and the 1/2 cost no instruction).
_Q9, _Q8, _Q7, _Q6, _Q5, _Q4, _Q3, _Q2, _Q1 = (tl.constexpr(c * _LOG2E) for c in _ERFCC[:9])
_Q0 = tl.constexpr(_ERFCC[9] * _LOG2E - 1.0)
_HALF_RSQRT2 = tl.constexpr(0.5 * 0.7071067811865476)  # z / 2 = |x| / (2 sqrt 2)
_HALF_LOG2E = tl.constexpr(0.5 * _LOG2E)  # z^2 log2(e) = x^2 log2(e) / 2


@triton.jit
def _rcp(d):
    """1 / d of an fp32 tensor with d >= 1: one MUFU.RCP on the GPU (rcp.approx.ftz, max 1 ulp, where Triton's fp32
    division is div.full: 2 ulp and eight instructions with its range checks); the interpreter divides."""
    if _INTERPRETED:
        r = 1.0 / d
    else:
        r = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [d], dtype=tl.float32, is_pure=True, pack=1)
    return r


@triton.jit
def _exp2(a):
    """2^a of an fp32 tensor: ex2.approx.f32 on the GPU, subnormal results kept (tl.math.exp2 compiles to the
    flushing MUFU.EX2 alone on Triton 3.8); the interpreter's exp2 elsewhere."""
    if _INTERPRETED:
        r = tl.math.exp2(a)
    else:
        r = tl.inline_asm_elementwise("ex2.approx.f32 $0, $1;", "=r,r", [a], dtype=tl.float32, is_pure=True, pack=1)
    return r


@triton.jit
def gelu_erf(x):
    """GELU (erf form) of an fp32 tensor, to 2e-6 relative for x >= -4, growing as x^2 beyond (module docstring)."""
    t = _rcp(tl.abs(x) * _HALF_RSQRT2 + 1.0)
    q = _Q9 * t + _Q8
    q = q * t + _Q7
    q = q * t + _Q6
    q = q * t + _Q5
    q = q * t + _Q4
    q = q * t + _Q3
    q = q * t + _Q2
    q = q * t + _Q1
    q = q * t + _Q0
    e = t * _exp2(q - x * x * _HALF_LOG2E)  # erfc(|x| / sqrt 2) / 2 = Phi(-|x|)
    return x * tl.where(x < 0.0, e, 1.0 - e)


# gelu_poly's P(a) ~ log2 Phi(-a) + a^2 log2(e) / 2 on [0, 6]: monomial coefficients of a^0 .. a^10
_P = (-0.9999995827674866, -1.1511212587356567, 0.2622406780719757, -0.05273430794477463, 0.0073249260894954205,
      -0.00027644672081805766, -0.00015822090790607035, 4.38474744441919e-05, -5.734862952522235e-06,
      3.985943806128489e-07, -1.1778168662601729e-08)  # fmt: skip
_P0, _P1, _P2, _P3, _P4, _P5, _P6, _P7, _P8, _P9, _P10 = (tl.constexpr(c) for c in _P)


@triton.jit
def _exp2_ftz(a):
    """2^a of an fp32 tensor: ex2.approx.ftz.f32 on the GPU (one MUFU.EX2; subnormal results flush to 0); the
    interpreter's exp2 elsewhere."""
    if _INTERPRETED:
        r = tl.math.exp2(a)
    else:
        r = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [a], dtype=tl.float32, is_pure=True, pack=1)
    return r


@triton.jit
def _phi_neg_abs(x):
    """Phi(-|x|) of an fp32 tensor (gelu_poly's polynomial and exp2)."""
    a = tl.minimum(tl.abs(x), 6.0)
    q = _P10 * a + _P9
    q = q * a + _P8
    q = q * a + _P7
    q = q * a + _P6
    q = q * a + _P5
    q = q * a + _P4
    q = q * a + _P3
    q = q * a + _P2
    q = q * a + _P1
    q = q * a + _P0
    return _exp2_ftz(q - x * x * _HALF_LOG2E)


@triton.jit
def gelu_poly(x):
    """GELU (erf form) of an fp32 tensor for fp16 / bf16 results: relative error below 5e-6 for x >= -6, within a
    factor 2.2 below (module docstring)."""
    # |x| capped at FLT_MAX: inf -> inf (not inf * 0), -inf -> 0 (GELU's limit); nan stays nan (through the exp2)
    return tl.maximum(x, 0.0) - tl.minimum(tl.abs(x), 3.4028234663852886e38) * _phi_neg_abs(x)


@triton.jit(do_not_specialize=["M", "has_bias"])
def _bias_gelu(X, Bias, Y, M, N, has_bias, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    num_n = tl.cdiv(N, BLOCK_N)
    rows = (pid // num_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = (pid % num_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_in = cols < N
    mask = (rows < M)[:, None] & col_in[None, :]
    offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    if has_bias != 0:
        x += tl.load(Bias + cols, mask=col_in, other=0.0).to(tl.float32)[None, :]
    tl.store(Y + offs, gelu_erf(x).to(Y.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["T", "B", "has_bias", "has_res", "has_live", "activation"])
def _ragged_linear(
    X,
    W,
    Bias,
    Res,
    CU,
    Y,
    T,
    N,
    K,
    B,
    has_bias,
    has_res,
    has_live,
    activation,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    num_m = tl.cdiv(T, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_n
    first_m = (pid // group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % size_m
    pid_n = (pid % group) // size_m

    live = T
    if has_live != 0:
        live = tl.minimum(tl.maximum(tl.load(CU + B), 0), T).to(tl.int32)

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_in = cols < N
    if pid_m * BLOCK_M < live:  # a tile of dead rows does nothing: no load, no store
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        ks = tl.arange(0, BLOCK_K)
        x_ptrs = X + rows.to(tl.int64)[:, None] * K + ks[None, :]
        w_ptrs = W + cols.to(tl.int64)[None, :] * K + ks[:, None]  # [BLOCK_K, BLOCK_N] view of W^T
        row_live = rows < live
        for k in range(0, K, BLOCK_K):
            k_in = ks < K - k
            a = tl.load(x_ptrs, mask=row_live[:, None] & k_in[None, :], other=0.0)
            b = tl.load(w_ptrs, mask=k_in[:, None] & col_in[None, :], other=0.0)
            if X.dtype.element_ty == tl.float32:
                acc = tl.dot(a, b, acc, input_precision="ieee")
            else:
                acc = tl.dot(a, b, acc)
            x_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        if has_bias != 0:
            acc += tl.load(Bias + cols, mask=col_in, other=0.0).to(tl.float32)[None, :]
        if activation == 1:
            acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))  # not gelu_erf: module docstring
        keep = row_live[:, None] & col_in[None, :]
        if has_res != 0:
            res_ptrs = Res + rows.to(tl.int64)[:, None] * N + cols[None, :]
            acc += tl.load(res_ptrs, mask=keep, other=0.0).to(tl.float32)
        y_ptrs = Y + rows.to(tl.int64)[:, None] * N + cols[None, :]
        tl.store(y_ptrs, acc.to(Y.dtype.element_ty), mask=keep)  # the live rows only: dead rows are never written


@triton.jit(do_not_specialize=["T", "B", "has_bias", "has_res", "has_live", "activation", "num_programs"])
def _ragged_linear_tma(
    X_desc,
    W_desc,
    Res_desc,
    Y_desc,
    Bias,
    CU,
    T,
    N,
    K,
    B,
    has_bias,
    has_res,
    has_live,
    activation,
    num_programs,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EPI_SPLIT: tl.constexpr = 1,
):
    # The same layer as `_ragged_linear` on Hopper's tensor memory accelerator: X_desc, W_desc, Res_desc, Y_desc
    # are TMA descriptors of X [T, K], W [N, K], Res [T, N] (Y's when has_res = 0: never read) and Y [T, N] with
    # blocks [BLOCK_M, BLOCK_K], [BLOCK_N, BLOCK_K], [BLOCK_M, BLOCK_N] and [BLOCK_M, BLOCK_N]. A persistent grid
    # of num_programs programs walks the live tiles only (cdiv(live, BLOCK_M) row tiles x cdiv(N, BLOCK_N), grouped
    # by GROUP_M row tiles), so the dead row tiles of a capacity layout cost no program and are never written. TMA
    # reads rows past T / columns past K as zeros and clips stores at T and N; the last live tile's rows in
    # [live, T) are computed from whatever X holds there (a row's products stay in its own row) and stored:
    # their values are unspecified, as every dead row's. EPI_SPLIT (1 or 2): the epilogue runs on column slices of
    # BLOCK_N / EPI_SPLIT (Res_desc and Y_desc blocks [BLOCK_M, BLOCK_N / EPI_SPLIT]), which halves the shared
    # memory of its store buffer and the registers live in it for large tiles.
    pid = tl.program_id(0)
    live = T
    if has_live != 0:
        live = tl.minimum(tl.maximum(tl.load(CU + B), 0), T).to(tl.int32)
    num_m = tl.cdiv(live, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(pid, num_m * num_n, num_programs, flatten=True):
        first_m = (tile // group) * GROUP_M
        size_m = tl.minimum(num_m - first_m, GROUP_M)
        pid_m = first_m + (tile % group) % size_m
        pid_n = (tile % group) // size_m
        row0 = pid_m * BLOCK_M
        col0 = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kk in range(k_tiles):
            a = X_desc.load([row0, kk * BLOCK_K])
            b = W_desc.load([col0, kk * BLOCK_K])
            acc = tl.dot(a, b.T, acc)
        if EPI_SPLIT == 2:
            halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
            left, right = tl.split(halves)
            _tma_epilogue(left, Res_desc, Y_desc, Bias, N, row0, col0, has_bias, has_res, activation, BLOCK_N // 2)
            _tma_epilogue(
                right, Res_desc, Y_desc, Bias, N, row0, col0 + BLOCK_N // 2, has_bias, has_res, activation, BLOCK_N // 2
            )
        else:
            _tma_epilogue(acc, Res_desc, Y_desc, Bias, N, row0, col0, has_bias, has_res, activation, BLOCK_N)


@triton.jit
def _tma_epilogue(acc, Res_desc, Y_desc, Bias, N, row0, col0, has_bias, has_res, activation, WIDTH: tl.constexpr):
    """Y[row0:, col0:col0 + WIDTH] = act(acc + Bias) + Res of one [BLOCK_M, WIDTH] fp32 slice of a tile."""
    if has_bias != 0:
        cols = col0 + tl.arange(0, WIDTH)
        acc += tl.load(Bias + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    if activation == 1:
        acc = gelu_poly(acc)  # fp16 / bf16 outputs only: module docstring
    if has_res != 0:
        acc += Res_desc.load([row0, col0]).to(tl.float32)
    Y_desc.store([row0, col0], acc.to(Y_desc.dtype))
