"""Triton kernel of com.raggedvit::GatherLayerNorm, shared by the torch wrapper (JIT) and the AOT build (DESIGN.md
section 3), and its launch configs (the AOT build loads this file without torch or raggedvit).

For each live output row r < live, with i = Index[r] (i < 0 counts from the end, as ONNX Gather):

    S[r] = X[i] + Skip[i] + Bias        (Skip, Bias optional; the sum in float32)
    N[r] = (S[r] - mean) / sqrt(var + eps) * Gamma + Beta   (mean, var over the D columns of the float32 sum)
    Sum[r] = S[r] rounded to X's dtype

where live = clamp(CU[B], 0, R) when has_live (the capacity layout's device-side count of live rows, DESIGN.md
section 4), else R. The dead rows r >= live of N and Sum are never written (no consumer reads them): a program whose
first row is at or past `live` returns at once (no load, no store), so a capacity layout's norm time follows its
live rows. An index outside [-T, T) gives zero rows in N and Sum (never an out-of-bounds read). Layout (row-major,
contiguous): X, Skip [T, D]; Bias, Gamma, Beta [D]; Index [R] int64; CU [B+1] int32 or int64; N, Sum [R, D]; X,
Skip, Bias, N, Sum in one dtype (fp16 / bf16 / fp32), Gamma, Beta in that dtype too. A program owns BLOCK_R rows of
BLOCK_D >= D columns (masked): one read of each gathered row, one write of each output. Grid: (cdiv(R, BLOCK_R),).
Every load is masked: any CU and Index value is safe.

It replaces a stage's Add (the block's residual sum) + Gather (the kept rows) + LayerNormalization (the next
block's norm1), three kernels and a copy in ONNX Runtime (its CUDA Gemm copies the residual into the output before
a beta = 1 GEMM), with one pass over the kept rows; with CU, ONNX Runtime's SkipLayerNormalization after a
RaggedLinear (the identity index), over the live rows only.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl

__all__ = ["NORM_BLOCK_DS", "NormConfig", "_gather_layer_norm", "aot_norm_configs", "norm_config"]

NORM_BLOCK_DS = (256, 512, 1024, 2048, 4096)  # BLOCK_D of the compiled variants: the smallest >= D (D <= 4096)
_ROW_ELEMENTS = 2048  # BLOCK_R * BLOCK_D per program (at least one row)


@dataclass(frozen=True)
class NormConfig:
    block_r: int
    block_d: int
    num_warps: int


def _config(block_d: int) -> NormConfig:
    return NormConfig(max(1, _ROW_ELEMENTS // block_d), block_d, 4 if block_d <= 1024 else 8)


def norm_config(D: int) -> NormConfig | None:
    """The config of a launch over rows of D columns (every dtype and arch); None when D > max(NORM_BLOCK_DS)."""
    for block_d in NORM_BLOCK_DS:
        if D <= block_d:
            return _config(block_d)
    return None


def aot_norm_configs() -> list[NormConfig]:
    """Every config `norm_config` can return; the C++ launcher applies the same rule (the smallest BLOCK_D >= D)."""
    return [_config(block_d) for block_d in NORM_BLOCK_DS]


@triton.jit(do_not_specialize=["T", "R", "B", "has_skip", "has_bias", "has_live"])
def _gather_layer_norm(
    X,
    Skip,
    Bias,
    Index,
    Gamma,
    Beta,
    CU,
    N,
    Sum,
    T,
    R,
    D,
    B,
    eps,
    has_skip,
    has_bias,
    has_live,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    live = R
    if has_live != 0:
        live = tl.minimum(tl.maximum(tl.load(CU + B), 0), R).to(tl.int32)
    first = tl.program_id(0) * BLOCK_R
    if first < live:  # a program of dead rows does nothing: no load, no store
        rows = first + tl.arange(0, BLOCK_R)
        row_in = rows < live
        i = tl.load(Index + rows, mask=row_in, other=0)
        i = tl.where(i < 0, i + T, i)
        valid = row_in & (i >= 0) & (i < T)
        src = tl.where(valid, i, 0).to(tl.int64)
        cols = tl.arange(0, BLOCK_D)
        col_in = cols < D
        m = valid[:, None] & col_in[None, :]
        offs = src[:, None] * D + cols[None, :]
        s = tl.load(X + offs, mask=m, other=0.0).to(tl.float32)
        if has_skip != 0:
            s += tl.load(Skip + offs, mask=m, other=0.0).to(tl.float32)
        if has_bias != 0:
            s += tl.load(Bias + cols, mask=col_in, other=0.0).to(tl.float32)[None, :]
        s = tl.where(m, s, 0.0)
        mean = tl.sum(s, axis=1) / D
        centred = tl.where(m, s - mean[:, None], 0.0)
        var = tl.sum(centred * centred, axis=1) / D
        rstd = 1.0 / tl.sqrt(var + eps)
        gamma = tl.load(Gamma + cols, mask=col_in, other=0.0).to(tl.float32)
        beta = tl.load(Beta + cols, mask=col_in, other=0.0).to(tl.float32)
        normed = tl.where(m, centred * rstd[:, None] * gamma[None, :] + beta[None, :], 0.0)
        out = rows.to(tl.int64)[:, None] * D + cols[None, :]
        keep = row_in[:, None] & col_in[None, :]  # the live rows only: dead rows are never written
        tl.store(N + out, normed.to(N.dtype.element_ty), mask=keep)
        tl.store(Sum + out, s.to(Sum.dtype.element_ty), mask=keep)
