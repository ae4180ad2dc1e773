"""Triton kernel of the ragged linear layer, shared by the torch op (JIT) and the AOT build (DESIGN.md section 2).

Y[r] = act(X[r] @ W^T + Bias) + Res[r] for the live rows r < live, and Y[r] = 0 for r >= live, where
live = clamp(CU[B], 0, T) when has_live (the capacity layout's device-side count), else T.

Layout (row-major, contiguous): X [T, K], W [N, K] (nn.Linear's weight), Bias [N], Res [T, N], Y [T, N] in one dtype
(fp16 / bf16 / fp32), CU [B+1] int32 or int64. activation: 0 none, 1 GELU (erf). A program owns one BLOCK_M x
BLOCK_N tile of Y (grouped ordering over GROUP_M row tiles for L2 reuse of W); a tile whose first row is at or past
`live` only writes zeros, so the GPU time of a capacity layout follows its live rows. Every load is masked: any CU
value, T, N, K >= 1 are safe. fp32 inputs use input_precision="ieee" (no tf32).

Grid: (cdiv(T, BLOCK_M) * cdiv(N, BLOCK_N),).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["_ragged_linear"]


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
    row_in = rows < T
    col_in = cols < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if pid_m * BLOCK_M < live:
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
            acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
        keep = row_live[:, None] & col_in[None, :]
        if has_res != 0:
            res_ptrs = Res + rows.to(tl.int64)[:, None] * N + cols[None, :]
            acc += tl.load(res_ptrs, mask=keep, other=0.0).to(tl.float32)
        acc = tl.where(keep, acc, 0.0)
    y_ptrs = Y + rows.to(tl.int64)[:, None] * N + cols[None, :]
    tl.store(y_ptrs, acc.to(Y.dtype.element_ty), mask=row_in[:, None] & col_in[None, :])
