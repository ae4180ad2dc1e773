"""Triton kernels of a pruning stage's index computation (`raggedvit::select_rows`, `com.raggedvit::RaggedSelect`),
shared by the torch op (JIT) and the AOT build (DESIGN.md section 4, "Capacity layout").

Inputs: Scores [T] fp32, CU [B+1] int64 (image b = rows [CU[b], CU[b+1]), n_b <= W). Two launches, grid (B,) each.
The rank of patch slot j of an image is #{patch slots i ahead of j}, i ahead of j when key_i > key_j or
(key_i == key_j and i < j) (key: the float's bits as an ordered int32, -0 = +0, so ties keep the lower position
first and any NaN still gives a total order). Two ways to the same ranks, picked at run time by W:

- W <= WP (the constexpr sort width, a power of two): the image's slots are loaded once as one [WP] vector of
  int64 `(key << 32) | (2^32 - 1 - j)` (non-patch slots: INT64_MIN, last) and sorted descending (tl.sort), so
  the order is exactly "ahead"; the count policy keeps the patch slots at or above the k-th sorted value, the
  mass policy reads the scores back from the sorted keys and sums them in sorted order.
- W > WP: O(W^2) pairwise comparisons in BLOCK x BLOCK tiles (any W).

1. `_select_count`: k of image b into K[b]: count policy ceil(f32(P_b) * keep); mass policy #{patch slots whose
   exclusive mass (sum of a_i = s_i / max(sum s, 1e-30) over the slots ahead) < mass}; then clamp(k, 1, P_b).
2. `_select_scatter`: each image's kept count c_b = min(n_b, p) + max(k_b, 0) (prefix slots, then the k best
   patch slots), the exclusive prefix of the counts of earlier images (every program sums them, in BLOCK
   chunks: any B) and the live total; CuNew; then the destination of each slot (kept: before + its kept
   index; other slots: live + (b*W + j) - kept before it) and, when below B*bound, Src / SeqId / Pos there.

CU is clamped (0 <= lo <= hi <= T, n_b <= W) so any CU value reads in bounds; every load and store is masked.
The count policy is exact. Mass sums: the sorted path takes the inclusive sum in float64 in sorted order, rounds
it to float32 and subtracts a (as the CPU op's cumsum does), the pairwise path sums in float32 in tile order; either
may differ from the CPU op in the last bits of the sums (DESIGN.md section 4).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["SELECT_BLOCK", "SELECT_SORT_WIDTHS", "_select_count", "_select_scatter", "select_launch_config"]

SELECT_BLOCK = 128  # slots per tile of the pairwise rank (W > WP) and per chunk of the images' counts
# (WP, num_warps) of the compiled variants, the JIT and AOT launch: the smallest WP >= W, else the last (pairwise).
# The sorted path is several times faster than the pairwise one at ViT widths (docs/decisions.md).
SELECT_SORT_WIDTHS = ((256, 4), (512, 8), (1024, 8), (2048, 16))

_NONE = tl.constexpr(-(2**63))  # the sort key of a non-patch slot: after every patch slot


def select_launch_config(width: int) -> tuple[int, int]:
    """(WP, num_warps) of the launch for images of up to `width` rows (the rule the C++ launcher applies)."""
    for wp, warps in SELECT_SORT_WIDTHS:
        if width <= wp:
            return wp, warps
    return SELECT_SORT_WIDTHS[-1]


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


@triton.jit
def _sorted_keys(Scores, lo, num_prefix, n, WP: tl.constexpr):
    """Slots j = 0..WP-1 of the image: (packed [WP] int64, j, patch mask), packed = key * 2^32 + (2^32 - 1 - j) at
    patch slots (distinct; larger = ahead), _NONE elsewhere; and the packed values sorted descending."""
    j = tl.arange(0, WP)
    key, _, patch = _keys(Scores, lo, j, num_prefix, n)
    packed = tl.where(patch, key.to(tl.int64) * 4294967296 + (4294967295 - j.to(tl.int64)), _NONE)
    return packed, j, patch, tl.sort(packed, descending=True)


@triton.jit(do_not_specialize=["T", "B", "W", "num_prefix", "policy", "keep_bits", "mass_bits"])
def _select_count(
    Scores, CU, K, T, B, W, num_prefix, policy, keep_bits, mass_bits, BLOCK: tl.constexpr, WP: tl.constexpr
):  # fmt: skip
    b = tl.program_id(0)
    lo, n = _image(CU, b, T, W)
    patches = n - num_prefix
    offs = tl.arange(0, BLOCK)
    if policy == 0:
        k = tl.ceil(patches.to(tl.float32) * keep_bits.to(tl.float32, bitcast=True)).to(tl.int64)
    elif W <= WP:
        _, _, _, srt = _sorted_keys(Scores, lo, num_prefix, n, WP)
        key = (srt >> 32).to(tl.int32)  # the scores back from their ordered keys, in rank order
        s = tl.where(srt != _NONE, tl.where(key < 0, key ^ 0x7FFFFFFF, key).to(tl.float32, bitcast=True), 0.0)
        a = s / tl.maximum(tl.sum(s, axis=0), 1e-30)
        excl = tl.cumsum(a.to(tl.float64), axis=0).to(tl.float32) - a
        k = tl.sum(((srt != _NONE) & (excl < mass_bits.to(tl.float32, bitcast=True))).to(tl.int64), axis=0)
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


@triton.jit
def _scatter_chunk(Src, SeqId, Pos, j, keep, b, lo, n, W, rows, before, carry, live):
    """Stores of image b's slots j (a chunk, in order) with their keep mask; carry = kept slots of the rows ahead
    of the chunk (earlier images' and this image's). Returns the chunk's kept count."""
    kept = keep.to(tl.int64)
    incl = tl.cumsum(kept, axis=0) + carry  # kept slots up to and including j, from row 0
    excl = incl - kept
    slot = b.to(tl.int64) * W + j
    dest = tl.where(keep, excl, live + slot - excl)
    ok = (j < W) & (dest < rows)
    tl.store(Src + dest, tl.where(j < n, lo + j, 0), mask=ok)
    tl.store(SeqId + dest, b.to(tl.int64) + j * 0, mask=ok)
    tl.store(Pos + dest, tl.maximum(incl - before - 1, 0), mask=ok)
    return tl.sum(kept, axis=0)


@triton.jit(do_not_specialize=["T", "B", "W", "bound", "num_prefix"])
def _select_scatter(
    Scores, CU, K, Src, CuNew, SeqId, Pos, T, B, W, bound, num_prefix, BLOCK: tl.constexpr, WP: tl.constexpr
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
    if W <= WP:
        packed, j, patch_j, srt = _sorted_keys(Scores, lo, num_prefix, n, WP)
        patches = n - num_prefix
        kth = tl.sum(tl.where(j.to(tl.int64) == k - 1, srt, 0), axis=0)  # the k-th best patch slot (1 <= k < P)
        best = patch_j & ((k >= patches) | ((k > 0) & (packed >= kth)))  # rank < k
        _scatter_chunk(Src, SeqId, Pos, j, (j < n) & ((j < num_prefix) | best), b, lo, n, W, rows, before, before,
                       live)  # fmt: skip
    else:
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
            carry += _scatter_chunk(Src, SeqId, Pos, j, keep, b, lo, n, W, rows, before, carry, live)
