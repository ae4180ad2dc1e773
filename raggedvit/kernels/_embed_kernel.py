"""Triton kernel of com.raggedvit::PatchEmbed, shared by the torch wrapper (JIT) and the AOT build (DESIGN.md
section 3), and its launch configs (the AOT build loads this file without torch or raggedvit).

A ViT's patch embedding, prefix rows and position table as one GEMM pass over the image:

    Out[b, P + l] = patches(Img)[b, l] @ W + Pos[P + l]     (l < L = gh * gw patches, row-major over the grid)
    Out[b, j]     = Prefix[j] + Pos[j]                      (j < P prefix rows: class / distillation tokens)

patches(Img)[b, l, k] = Img[b, c, py * p + ky, px * p + kx] with (py, px) = divmod(l, gw) and
k = (c * p + ky) * p + kx: Conv2d(C, N, p, stride p)'s weight flattened to [N, K] is W^T, K = C * p * p. The conv's
bias rides in Pos (the exporter folds it into the patch rows of the position table).

Layout (row-major, contiguous): Img [B, C, H, Wd] float32 / float16 (pixels past gh * p or gw * p are never read,
as a stride-p conv); W [K, N] float16; Prefix [P, N], Pos [P + L, N] float32; Out [B, P + L, N] float16. Products:
Img rounded to float16, float16 tensor-core dots with float32 accumulation; Pos and Prefix added in float32; Out
rounded once. Grid: ((cdiv(B * L, BLOCK_M) + cdiv(B * P, BLOCK_M)) * cdiv(N, BLOCK_N),): the first programs own
BLOCK_M x BLOCK_N tiles of the B * L patch rows (N tiles of one row tile are neighbours: the image tile is read
from L2 by all but the first), the rest write the B * P prefix rows. Every load is masked.

It replaces ONNX Runtime's float32 Reshape / Transpose (im2col, a copy of the image) / MatMul (TF32) / Concat /
Add / Cast chain, five kernels that write the image twice and the rows three times, with one read of the image
and one write of the rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl

__all__ = ["EMBED_LARGE_M", "EMBED_MID_M", "EmbedConfig", "_patch_embed", "aot_embed_configs", "embed_config"]

EMBED_MID_M = 512  # patch rows (B * L) from which the mid-size tiles are used
EMBED_LARGE_M = 16384  # patch rows from which the large tiles are used


@dataclass(frozen=True)
class EmbedConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


# Tiles by row count (deit_base / deit_small at 224; figures in docs/decisions.md): 32 x 64 at B = 1 (196 rows:
# more programs), 64 x 128 on 4 warps at B = 4 and 32, 128 x 128 on 8 warps at B = 128 (128 x 256 tiles need more
# shared memory than sm_86 / sm_89 have).
_SMALL = EmbedConfig(32, 64, 64, 4, 3)
_MID = EmbedConfig(64, 128, 64, 4, 3)
_LARGE = EmbedConfig(128, 128, 64, 8, 3)


def embed_config(M: int) -> EmbedConfig:
    """The config of a launch over M = B * L patch rows (every arch)."""
    return _LARGE if M >= EMBED_LARGE_M else _MID if M >= EMBED_MID_M else _SMALL


def aot_embed_configs() -> list[tuple[str, EmbedConfig]]:
    """(name, config) of every config `embed_config` can return; the C++ launcher applies the same rule."""
    return [("small", _SMALL), ("mid", _MID), ("large", _LARGE)]


@triton.jit(do_not_specialize=["B"])
def _patch_embed(
    Img,
    W,
    Prefix,
    Pos,
    Out,
    B,
    C,
    H,
    Wd,
    gw,
    L,
    P,
    N,
    K,
    patch,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    num_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_n
    pid_n = pid % num_n
    M = B * L
    num_m = tl.cdiv(M, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_in = cols < N
    S = P + L  # output rows per image
    if pid_m < num_m:
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        row_in = rows < M
        b = rows // L
        tok = rows % L  # patch index in the image
        py = tok // gw
        px = tok % gw
        # pixel offset of each row's patch corner, and of each k inside a patch
        row_base = ((b.to(tl.int64) * C) * H + py * patch) * Wd + px * patch
        pp = patch * patch
        ks = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + ks
            k_in = k < K
            c = k // pp
            rem = k % pp
            k_off = (c * H + rem // patch) * Wd + rem % patch
            a = tl.load(Img + row_base[:, None] + k_off[None, :], mask=row_in[:, None] & k_in[None, :], other=0.0)
            w = tl.load(W + k.to(tl.int64)[:, None] * N + cols[None, :], mask=k_in[:, None] & col_in[None, :],
                        other=0.0)  # fmt: skip
            acc = tl.dot(a.to(tl.float16), w.to(tl.float16), acc)
        keep = row_in[:, None] & col_in[None, :]
        acc += tl.load(Pos + (P + tok).to(tl.int64)[:, None] * N + cols[None, :], mask=keep, other=0.0)
        out_rows = b.to(tl.int64) * S + P + tok
    else:
        rows = (pid_m - num_m) * BLOCK_M + tl.arange(0, BLOCK_M)
        row_in = rows < B * P
        j = rows % tl.maximum(P, 1)
        keep = row_in[:, None] & col_in[None, :]
        offs = j.to(tl.int64)[:, None] * N + cols[None, :]
        acc = tl.load(Prefix + offs, mask=keep, other=0.0) + tl.load(Pos + offs, mask=keep, other=0.0)
        out_rows = (rows // tl.maximum(P, 1)).to(tl.int64) * S + j
    tl.store(Out + out_rows[:, None] * N + cols[None, :], acc.to(Out.dtype.element_ty), mask=keep)
