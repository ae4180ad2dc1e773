"""One token-pruning stage on packed rows (DESIGN.md section 4), all on the device.

General stage: padded per-image scores [B, Nmax] are gathered from the packed rows, the keep mask comes from
TopK (stable descending sort) + inverse permutation, and the new packed rows from NonZero + Gather,
so no row count is fixed anywhere. Nothing is read back by raggedvit; the one NonZero per stage makes ORT's CUDA
kernel copy its count to the host (evit with fuse adds one more for the row coordinates of the fused token).

Uniform stage (every image has the same, export-time-known row count n and the policy keeps a count that
depends on n only: topk-l2, evit without fuse): k = clamp(ceil(f32(keep) * f32(n - p)), 1, n - p) is a
constant, so the stage is TopK(k) of the [B, n - p] patch scores, an ascending sort of the k kept positions
and one Gather: static shapes, no NonZero (whose CUDA kernel copies its count to the host), and a
topk-l2 / evit graph becomes capturable as a CUDA graph. Same kept rows, same order as the general stage.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from raggedvit.exporter._builder import GraphBuilder
from raggedvit.exporter.embed import Packed, cu_from_counts
from raggedvit.exporter.layers import float32_to_stream, stream_to_float32

__all__ = ["l2_scores", "prune_stage", "row_coordinates", "uniform_keep"]

_F32 = TensorProto.FLOAT
_I64 = TensorProto.INT64
_NEG_INF = np.float32(-np.inf)
CLS_MASS_EPS = 1e-30  # as raggedvit.pruning.select.CLS_MASS_EPS


def l2_scores(g: GraphBuilder, x: str, width: int, hint: str) -> str:
    """x [T, C] float32 (the residual stream) -> s [T] float32 = |x_t|^2 / C + 1e-5, rank-equivalent to the L2 norm.

    From a LayerNormalization's Mean and InvStdDev outputs (s = mean^2 + 1 / inv_std^2 = mean^2 + var + eps):
    ORT's CUDA ReduceL2 over the last axis goes through cuDNN (41 us at deit_base B=1, 69 us at B=32 on the
    H200, 2026-11-29 profile); the LayerNormalization kernel is a few microseconds. Stages only rank these
    scores, so the monotone transform keeps every decision (up to float32 rounding, as any norm would)."""
    ones = g.const(np.ones(width, g.stream_dtype), hint="ln_ones")  # [C] in x's dtype; mean/inv_std are float32
    zeros = g.const(np.zeros(width, g.stream_dtype), hint="ln_zeros")
    _, mean, inv = g.op_multi(
        "LayerNormalization", [x, ones, zeros], hint=f"{hint}.moments", n_out=3, axis=-1, epsilon=1e-5
    )  # mean, inv_std [T, 1]
    sq = g.op("Add", [g.op("Mul", [mean, mean]), g.op("Reciprocal", [g.op("Mul", [inv, inv])])], hint=f"{hint}.sq")
    return g.op("Reshape", [sq, g.const([-1], np.int64)], hint=hint)


def row_coordinates(g: GraphBuilder, state: Packed, hint: str) -> tuple[str, str, str]:
    """(seq_id [T], pos [T], zeros [B, 1]) int64 of the packed rows, derived from counts alone.

    nonzero(i < n_b) over the padded [B, Nmax] grid lists the rows in packed (row-major) order.
    """
    zeros_b1 = g.op(
        "Mul",
        [g.op("Unsqueeze", [state.counts, g.const([1], np.int64)]), g.const(0, np.int64)],
        hint=f"{hint}.zeros_b1",
    )
    grid_i = g.op("Add", [zeros_b1, g.const(np.arange(state.nmax, dtype=np.int64)[None])], hint=f"{hint}.i")
    valid = g.op("Less", [grid_i, g.op("Unsqueeze", [state.counts, g.const([1], np.int64)])], hint=f"{hint}.valid")
    nz = g.op("NonZero", [valid], hint=f"{hint}.nz")  # [2, T]
    seq = g.op("Gather", [nz, g.const(0, np.int64)], hint=f"{hint}.seq", axis=0)
    pos = g.op("Gather", [nz, g.const(1, np.int64)], hint=f"{hint}.pos", axis=0)
    return seq, pos, zeros_b1


def prune_stage(
    g: GraphBuilder,
    state: Packed,
    scores: str,
    *,
    policy: str,
    keep: float,
    mass: float,
    fuse: bool,
    num_prefix: int,
    hint: str,
) -> Packed:
    """Keep the top-scoring patch rows of every image.

    scores [T] float32 (L2 norm or cls_attn of the previous block). Returns the new Packed state
    (x [T', C], counts [B] = n'_b, cu [B+1]); with `fuse` (evit) one extra token per image is
    appended last: the cls_attn-weighted mean of its dropped patch rows.
    """
    p, nmax, h = num_prefix, state.nmax, hint
    if state.uniform is not None and policy in ("topk-l2", "evit") and not fuse:
        return _uniform_stage(g, state, scores, keep=keep, num_prefix=p, hint=h)
    row = g.const(np.arange(nmax, dtype=np.int64)[None], hint="arange_row")  # [1, Nmax]
    n_b1 = g.op("Unsqueeze", [state.counts, g.const([1], np.int64)], hint=f"{h}.n")  # [B, 1]
    base = g.op(
        "Unsqueeze",
        [g.op("Slice", [state.cu, g.const([0], np.int64), g.const([-1], np.int64)]), g.const([1], np.int64)],
        hint=f"{h}.base",
    )  # [B, 1] first packed row of each image
    patches = g.op("Sub", [n_b1, g.const(p, np.int64)], hint=f"{h}.P")  # [B, 1]

    # 2. padded scores S [B, Nmax]: a Gather of each image's rows, -inf everywhere but at patch rows (no scatter,
    # and no NonZero for row coordinates: one host synchronisation per stage, the kept-row NonZero below).
    idx = g.op("Add", [base, row], hint=f"{h}.idx")  # [B, Nmax] packed row of slot j (past the image: garbage)
    grid_i = g.op("Sub", [idx, base], hint=f"{h}.grid_i")  # [B, Nmax] = j
    valid = g.op("Less", [row, n_b1], hint=f"{h}.valid")  # [B, Nmax] slot j < n_b
    gathered = g.op("Gather", [scores, g.op("Where", [valid, idx, g.const(0, np.int64)])], hint=f"{h}.s_rows", axis=0)
    is_patch = valid if p == 0 else g.op("And", [valid, g.const(np.arange(nmax)[None] >= p)], hint=f"{h}.is_patch")
    S = g.op("Where", [is_patch, gathered, g.const(_NEG_INF)], hint=f"{h}.S")

    # 4. stable descending order and its inverse permutation.
    sorted_vals, order = g.op_multi(
        "TopK", [S, g.const([nmax], np.int64)], hint=f"{h}.sort", n_out=2, axis=1, largest=1, sorted=1
    )
    rank = g.op("ScatterElements", [grid_i, order, grid_i], hint=f"{h}.rank", axis=1)

    # 3. tokens kept per image, k [B, 1].
    if policy in ("topk-l2", "evit"):
        kf = g.op("Ceil", [g.op("Mul", [g.op("Cast", [patches], to=_F32), g.const(np.float32(keep))])], hint=f"{h}.kf")
        k = g.op("Cast", [kf], hint=f"{h}.k_raw", to=_I64)
    elif policy == "cls-mass":
        k = _mass_count(g, sorted_vals, grid_i, patches, mass=mass, hint=h)
    else:
        raise ValueError(f"unknown pruning policy {policy!r}")
    k = g.op("Min", [g.op("Max", [k, g.const(1, np.int64)]), patches], hint=f"{h}.k")

    in_rank = g.op("Less", [rank, k], hint=f"{h}.in_rank")
    if p:
        in_rank = g.op("Or", [g.const(np.arange(nmax)[None] < p), in_rank], hint=f"{h}.prefix_or_rank")
    keep_mask = g.op("And", [valid, in_rank], hint=f"{h}.keep")  # [B, Nmax] bool

    # 5. + 6. gather the kept rows (and the fused token, as an extra column Nmax) in row-major order.
    x_src, keep_ext, nmax_out = state.x, keep_mask, nmax
    if fuse:
        seq, pos, zeros_b1 = row_coordinates(g, state, h)
        coords = g.op(
            "Concat",
            [g.op("Unsqueeze", [seq, g.const([1], np.int64)]), g.op("Unsqueeze", [pos, g.const([1], np.int64)])],
            hint=f"{h}.coords",
            axis=1,
        )  # [T, 2]
        fused = _fused_tokens(g, state.x, scores, seq, keep_mask, coords, zeros_b1, h)  # [B, C]
        fused = float32_to_stream(g, fused, f"{h}.fused_stream")
        x_src = g.op("Concat", [state.x, fused], hint=f"{h}.x_src", axis=0)  # [T + B, C]
        true_b1 = g.op("Equal", [zeros_b1, g.const(0, np.int64)], hint=f"{h}.true_b1")  # [B, 1]
        keep_ext = g.op("Concat", [keep_mask, true_b1], hint=f"{h}.keep_ext", axis=1)  # [B, Nmax + 1]
        nmax_out = nmax + 1
    nz = g.op("NonZero", [keep_ext], hint=f"{h}.kept")  # [2, T']
    b = g.op("Gather", [nz, g.const(0, np.int64)], hint=f"{h}.b", axis=0)
    i = g.op("Gather", [nz, g.const(1, np.int64)], hint=f"{h}.i_kept", axis=0)
    src = g.op("Add", [g.op("Gather", [state.cu, b], axis=0), i], hint=f"{h}.src")
    if fuse:
        total = g.op("Gather", [state.cu, g.const(-1, np.int64)], hint=f"{h}.T", axis=0)
        fused_src = g.op("Add", [total, b], hint=f"{h}.fused_src")
        src = g.op("Where", [g.op("Equal", [i, g.const(nmax, np.int64)]), fused_src, src], hint=f"{h}.src_ext")
    x = g.op("Gather", [x_src, src], hint=f"{h}.x", axis=0)
    counts = g.op(
        "ReduceSum", [g.op("Cast", [keep_ext], to=_I64), g.const([1], np.int64)], hint=f"{h}.counts", keepdims=0
    )
    cu = cu_from_counts(g, counts, f"{h}.cu")
    cu32 = g.op("Cast", [cu], hint=f"{h}.cu_i32", to=TensorProto.INT32)
    return Packed(x=x, cu=cu, cu32=cu32, counts=counts, nmax=nmax_out)


def uniform_keep(n: int, num_prefix: int, keep: float) -> int:
    """Patch rows kept of an image with n rows: clamp(ceil(f32(keep) * f32(n - p)), 1, n - p) (float32 as select.py)."""
    patches = n - num_prefix
    k = int(np.ceil(np.float32(keep) * np.float32(patches)))
    return min(max(k, 1), patches)


def _uniform_stage(g: GraphBuilder, state: Packed, scores: str, *, keep: float, num_prefix: int, hint: str) -> Packed:
    """topk-l2 / evit stage of a uniform state (n rows per image): static shapes only.

    scores [B*n] float32 -> x [B*(p+k), C]; rows of image b: its p prefix rows, then its k best patch rows
    in ascending position (TopK picks the lower position among equal scores, as the general stage)."""
    p, n, h = num_prefix, int(state.uniform), hint
    k = uniform_keep(n, p, keep)
    m = p + k
    S = g.op("Reshape", [scores, g.const([-1, n], np.int64)], hint=f"{h}.S")  # [B, n]
    if p:
        S = g.op("Slice", [S, g.const([p], np.int64), g.const([n], np.int64), g.const([1], np.int64)], hint=f"{h}.Sp")
    _, best = g.op_multi("TopK", [S, g.const([k], np.int64)], hint=f"{h}.topk", n_out=2, axis=1, largest=1, sorted=1)
    ordered, _ = g.op_multi(
        "TopK", [best, g.const([k], np.int64)], hint=f"{h}.ascending", n_out=2, axis=1, largest=0, sorted=1
    )  # [B, k] patch positions, ascending
    base = g.op(
        "Unsqueeze",
        [g.op("Slice", [state.cu, g.const([0], np.int64), g.const([-1], np.int64)]), g.const([1], np.int64)],
        hint=f"{h}.base",
    )  # [B, 1] = b * n, the first packed row of each image
    rows = g.op("Add", [ordered, g.op("Add", [base, g.const(p, np.int64)])], hint=f"{h}.patch_rows")  # [B, k]
    if p:
        prefix_rows = g.op("Add", [base, g.const(np.arange(p, dtype=np.int64)[None])], hint=f"{h}.prefix_rows")
        rows = g.op("Concat", [prefix_rows, rows], hint=f"{h}.rows", axis=1)  # [B, p + k]
    src = g.op("Reshape", [rows, g.const([-1], np.int64)], hint=f"{h}.src")
    x = g.op("Gather", [state.x, src], hint=f"{h}.x", axis=0)
    n_c, m_c = g.const(n, np.int64), g.const(m, np.int64)
    counts = g.op("Mul", [g.op("Div", [state.counts, n_c]), m_c], hint=f"{h}.counts")  # [B] = m
    cu = g.op("Mul", [g.op("Div", [state.cu, n_c]), m_c], hint=f"{h}.cu")  # [B+1] = b * m
    cu32 = g.op("Cast", [cu], hint=f"{h}.cu_i32", to=TensorProto.INT32)
    return Packed(x=x, cu=cu, cu32=cu32, counts=counts, nmax=m, uniform=m)


def _mass_count(g, sorted_vals, grid_i, patches, *, mass, hint):
    """cls-mass k_b [B, 1] int64, as raggedvit.pruning.select: a = sorted patch scores / their sum (floor 1e-30),
    k_b = #{j < P_b : exclusive cumsum a_j < mass}."""
    h = hint
    valid = g.op("Less", [grid_i, patches], hint=f"{h}.sorted_valid")  # sorted slot j < P_b holds a patch score
    a = g.op("Where", [valid, sorted_vals, g.const(np.float32(0))], hint=f"{h}.a_sorted")
    total = g.op(
        "Max",
        [g.op("ReduceSum", [a, g.const([1], np.int64)], keepdims=1), g.const(np.float32(CLS_MASS_EPS))],
        hint=f"{h}.mass_total",
    )
    a = g.op("Div", [a, total], hint=f"{h}.a")
    excl = g.op("Sub", [g.op("CumSum", [a, g.const(1, np.int64)], hint=f"{h}.c"), a], hint=f"{h}.c_excl")
    below = g.op("And", [valid, g.op("Less", [excl, g.const(np.float32(mass))])], hint=f"{h}.below")
    return g.op("ReduceSum", [g.op("Cast", [below], to=_I64), g.const([1], np.int64)], hint=f"{h}.k_mass", keepdims=1)


def _fused_tokens(g, x, scores, seq, keep_mask, coords, zeros_b1, hint):
    """evit fuse: per image sum over dropped patch rows of a_t x_t / max(sum a_t, 1e-12) -> [B, C] float32."""
    h = hint
    kept_row = g.op("GatherND", [keep_mask, coords], hint=f"{h}.kept_row")  # [T] bool (prefix rows are kept)
    w = g.op("Where", [kept_row, g.const(np.float32(0)), scores], hint=f"{h}.w")  # [T]
    ones_b1 = g.op("Add", [zeros_b1, g.const(1, np.int64)])
    b_col = g.op("CumSum", [ones_b1, g.const(0, np.int64)], hint=f"{h}.b_col", exclusive=1)  # [B, 1] = b
    member = g.op("Equal", [b_col, g.op("Unsqueeze", [seq, g.const([0], np.int64)])], hint=f"{h}.member")  # [B, T]
    wmat = g.op("Mul", [g.op("Cast", [member], to=_F32), w], hint=f"{h}.wmat")  # [B, T]
    num = g.op("MatMul", [wmat, stream_to_float32(g, x, f"{h}.x32")], hint=f"{h}.fuse_num")  # float32  # [B, C]
    den = g.op(
        "Max",
        [g.op("ReduceSum", [wmat, g.const([1], np.int64)], keepdims=1), g.const(np.float32(1e-12))],
        hint=f"{h}.fuse_den",
    )
    return g.op("Div", [num, den], hint=f"{h}.fused")
