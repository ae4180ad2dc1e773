"""Triton kernels of a pruning stage's index computation (`raggedvit::select_rows`, `com.raggedvit::RaggedSelect`),
shared by the torch op (JIT) and the AOT build (DESIGN.md section 4, "Capacity layout").

Inputs: Scores [T] fp32, CU [B+1] int64 (image b = rows [CU[b], CU[b+1]), n_b <= W). Two launches, grid (B,) each,
no sort: the rank of patch slot j of an image is #{patch slots i ahead of j}, i ahead of j when key_i > key_j or
(key_i == key_j and i < j), by O(W^2) pairwise comparisons in BLOCK x BLOCK tiles (key: the float's bits as an
ordered int32, -0 = +0, so ties keep the lower position first and any NaN still gives a total order).

1. `_select_count`: k of image b into K[b]: count policy ceil(f32(P_b) * keep); mass policy #{patch slots whose
   exclusive mass (sum of a_i = s_i / max(sum s, 1e-30) over the slots ahead) < mass}; then clamp(k, 1, P_b).
2. `_select_scatter`: each image's kept count c_b = min(n_b, p) + max(k_b, 0) (prefix slots, then the k best
   patch slots), the exclusive prefix of the counts of earlier images (every program sums them, in BLOCK
   chunks: any B) and the live total; CuNew; then the destination of each slot (kept: before + its kept
   index; other slots: live + (b*W + j) - kept before it) and, when below B*bound, Src / SeqId / Pos there.

CU is clamped (0 <= lo <= hi <= T, n_b <= W) so any CU value reads in bounds; every load and store is masked.
The mass sums run in float32 in tile order (torch: a double cumsum): the count policy is exact, the mass policy
may differ from the CPU op in the last bits of the sums (DESIGN.md section 4).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["SELECT_BLOCK", "SELECT_NUM_WARPS", "_select_count", "_select_scatter"]

SELECT_BLOCK = 128  # slots per tile of the pairwise rank (a BLOCK x BLOCK comparison tile); the JIT and AOT launch
SELECT_NUM_WARPS = 8  # 128 x 128 tiles on 8 warps: a 197-token image in 2 x 2 tiles (64 x 64 on 4 warps: 4 x 4)


@triton.jit
def _image(CU, b, T, W):
    """(first row, rows n) of image b with CU clamped into [0, T] and n into [0, W]."""
    lo = tl.minimum(tl.maximum(tl.load(CU + b), 0), T)
    hi = tl.minimum(tl.maximum(tl.load(CU + b + 1), lo), T)
    return lo, tl.minimum(hi - lo, W)


@triton.jit
def _keys(Scores, lo, idx, num_prefix, n):
    """Ordered int32 keys of slots idx (patch slots num_prefix <= idx < n), and the patch mask."""
    patch = (idx >= num_prefix) & (idx < n)
    s = tl.load(Scores + lo + idx, mask=patch, other=0.0) + 0.0  # -0 -> +0
    bits = s.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits), s, patch


@triton.jit
def _ahead(key_i, i, patch_i, key_j, j):
    """[BLOCK_i, BLOCK_j] mask: patch slot i ranks ahead of slot j."""
    ki = key_i[:, None]
    kj = key_j[None, :]
    return patch_i[:, None] & ((ki > kj) | ((ki == kj) & (i[:, None] < j[None, :])))


@triton.jit(do_not_specialize=["T", "B", "W", "num_prefix", "policy", "keep_bits", "mass_bits"])
def _select_count(Scores, CU, K, T, B, W, num_prefix, policy, keep_bits, mass_bits, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    lo, n = _image(CU, b, T, W)
    patches = n - num_prefix
    offs = tl.arange(0, BLOCK)
    if policy == 0:
        k = tl.ceil(patches.to(tl.float32) * keep_bits.to(tl.float32, bitcast=True)).to(tl.int64)
    else:
        total = tl.zeros([BLOCK], dtype=tl.float32)
        for c in range(0, tl.cdiv(n, BLOCK)):
            _, s, patch = _keys(Scores, lo, c * BLOCK + offs, num_prefix, n)
            total += tl.where(patch, s, 0.0)
        den = tl.maximum(tl.sum(total, axis=0), 1e-30)
        mass = mass_bits.to(tl.float32, bitcast=True)
        k = tl.zeros([BLOCK], dtype=tl.int64)
        for cj in range(0, tl.cdiv(n, BLOCK)):
            j = cj * BLOCK + offs
            key_j, _, patch_j = _keys(Scores, lo, j, num_prefix, n)
            excl = tl.zeros([BLOCK], dtype=tl.float32)
            for ci in range(0, tl.cdiv(n, BLOCK)):
                i = ci * BLOCK + offs
                key_i, s_i, patch_i = _keys(Scores, lo, i, num_prefix, n)
                a_i = tl.where(patch_i, s_i / den, 0.0)
                excl += tl.sum(tl.where(_ahead(key_i, i, patch_i, key_j, j), a_i[:, None], 0.0), axis=0)
            k += (patch_j & (excl < mass)).to(tl.int64)
        k = tl.sum(k, axis=0)
    k = tl.minimum(tl.maximum(k, 1), patches.to(tl.int64))
    tl.store(K + b, k)


@triton.jit
def _kept_count(CU, K, b, T, W, num_prefix, mask):
    """c_b = min(n_b, p) + max(k_b, 0) of the images b (a block), 0 where masked off."""
    lo = tl.minimum(tl.maximum(tl.load(CU + b, mask=mask, other=0), 0), T)
    hi = tl.minimum(tl.maximum(tl.load(CU + b + 1, mask=mask, other=0), lo), T)
    n = tl.minimum(hi - lo, W)
    k = tl.load(K + b, mask=mask, other=0)
    return tl.where(mask, tl.minimum(n, num_prefix) + tl.maximum(k, 0), 0)


@triton.jit(do_not_specialize=["T", "B", "W", "bound", "num_prefix"])
def _select_scatter(
    Scores, CU, K, Src, CuNew, SeqId, Pos, T, B, W, bound, num_prefix, BLOCK: tl.constexpr
):  # fmt: skip
    b = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    before = tl.zeros([BLOCK], dtype=tl.int64)
    live = tl.zeros([BLOCK], dtype=tl.int64)
    for c in range(0, tl.cdiv(B, BLOCK)):
        bb = c * BLOCK + offs
        counts = _kept_count(CU, K, bb, T, W, num_prefix, bb < B)
        before += tl.where(bb < b, counts, 0)
        live += counts
    before = tl.sum(before, axis=0)
    live = tl.sum(live, axis=0)
    lo, n = _image(CU, b, T, W)
    k = tl.load(K + b)
    mine = tl.minimum(n, num_prefix) + tl.maximum(k, 0)
    tl.store(CuNew + b + 1, before + mine)
    if b == 0:
        tl.store(CuNew, before * 0)
    rows = (b * 0 + B).to(tl.int64) * bound
    carry = before  # kept slots of earlier images and of this image before the chunk
    for cj in range(0, tl.cdiv(W, BLOCK)):
        j = cj * BLOCK + offs
        key_j, _, patch_j = _keys(Scores, lo, j, num_prefix, n)
        rank = tl.zeros([BLOCK], dtype=tl.int32)
        for ci in range(0, tl.cdiv(n, BLOCK)):
            i = ci * BLOCK + offs
            key_i, _, patch_i = _keys(Scores, lo, i, num_prefix, n)
            rank += tl.sum(_ahead(key_i, i, patch_i, key_j, j).to(tl.int32), axis=0)
        keep = (j < n) & ((j < num_prefix) | (patch_j & (rank.to(tl.int64) < k)))
        kept = keep.to(tl.int64)
        incl = tl.cumsum(kept, axis=0) + carry  # kept slots up to and including j, from row 0
        excl = incl - kept
        slot = b.to(tl.int64) * W + j
        dest = tl.where(keep, excl, live + slot - excl)
        ok = (j < W) & (dest < rows)
        tl.store(Src + dest, tl.where(j < n, lo + j, 0), mask=ok)
        tl.store(SeqId + dest, b.to(tl.int64) + j * 0, mask=ok)
        tl.store(Pos + dest, tl.maximum(incl - before - 1, 0), mask=ok)
        carry += tl.sum(kept, axis=0)
