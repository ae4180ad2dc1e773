"""Seeded inputs of the merge kernel (`_merge_kernel`, RaggedMerge on CUDA) against `merge_tokens_reference`, shared
by its interpreter run (tests/kernels/_merge_cases.py) and the GPU checks, with the comparison both use (the CPU
EP's cases: tests/support/merge_cases.py).

Two kinds of keys:
- planted (the default): each A row's metric is near one B row of its image at a spread angle, so the best scores
  spread over [0, 1] and the decisions (each merged row's best B row, the order of the A rows the output depends
  on) have margins well above float32 rounding; `decision_margins` measures them in float64, and a comparison of
  src / x is exact only where they exceed MARGIN (two float32 computations of one cosine differ in their last bits).
- ties: every key row is one of 4 sign patterns of +-1/8 (64 entries: norm 1), the same in every head, and the k
  part of the bias is 0: metric, norms and cosines are exact in any summation order, so equal scores are equal
  bits everywhere and the tie rules (lowest B index; stable descending order of the A rows) decide.

Sizes: "none" (every row 1), "int" (1..4: exact sums in any order) or "frac" (non-integer: sizes compared within
float32 rounding). skip: "" (x is the rows merged), "skip" or "skip-bias" (the op adds the attention branch, and
its bias, to x first: `make_skip_inputs`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from raggedvit.pruning.merge import merge_sets, merge_widths, merged_count

__all__ = ["MARGIN", "MERGE_CASES", "MERGE_SLOW_CASES", "MergeCase", "compare_merge", "decision_margins",
           "make_merge_inputs", "make_skip_inputs"]  # fmt: skip

MARGIN = 2e-6  # decisions closer than this (float64 scores) may differ between two float32 computations


class MergeCase(NamedTuple):
    name: str
    B: int
    n: int
    H: int
    Dh: int
    p: int  # num_prefix
    r: int
    class_token: bool
    dtype: torch.dtype = torch.float32
    bias: bool = True
    size: str = "int"  # "none" | "int" | "frac"
    ties: bool = False
    C: int = 0  # 0: H * Dh
    config: tuple[int, int] | None = None  # launch_merge's (NP, num_warps) instead of the width's
    nan: str = ""  # "a" / "b": one k entry of an A / B row of the last image is NaN (its scores are NaN)
    skip: str = ""  # "" | "skip" | "skip-bias": the fused attention residual's inputs (make_skip_inputs)


MERGE_CASES = [
    MergeCase("deit-s-b3", 3, 197, 6, 64, 1, 8, True),
    MergeCase("deit-s-fp16-order", 1, 197, 6, 64, 1, 8, False, torch.float16, size="none"),
    MergeCase("deit-b-fp16", 1, 197, 12, 64, 1, 13, True, torch.float16, bias=False),
    MergeCase("p0-order", 3, 40, 2, 32, 0, 5, False, bias=False),
    MergeCase("p2-fp16", 3, 41, 3, 64, 2, 7, True, torch.float16),
    MergeCase("p2-bf16", 2, 41, 3, 64, 2, 7, False, torch.bfloat16),  # the JIT launch only (no bf16 cubins)
    MergeCase("p5-frac", 1, 30, 2, 16, 5, 4, False, size="frac"),
    MergeCase("r0", 2, 25, 2, 32, 1, 0, True),
    MergeCase("clamped", 3, 24, 2, 16, 2, 100, False, C=48),
    MergeCase("chunks", 2, 80, 2, 32, 1, 30, True, torch.float16),  # r_eff 30: two chunks of merged rows
    MergeCase("ties-fp16", 3, 60, 4, 64, 1, 12, False, torch.float16, ties=True),
    MergeCase("ties-chunks", 2, 61, 2, 64, 0, 20, True, ties=True),
    MergeCase("one-b-row", 2, 7, 2, 16, 5, 3, False),  # n_A = n_B = 1
    MergeCase("no-b-row", 2, 6, 2, 16, 5, 3, True),  # n_A = 0, n_B = 1: nothing merges
    MergeCase("prefix-only", 2, 3, 2, 16, 3, 2, False),  # p = n
    MergeCase("b1-small", 1, 9, 1, 16, 1, 2, True, size="none"),
    MergeCase("nan-a-row", 2, 41, 2, 32, 1, 6, False, nan="a"),  # that row ranks first (torch: NaN is the largest)
    MergeCase("nan-b-row", 2, 41, 2, 32, 1, 6, True, torch.float16, nan="b"),  # every A row of the image matches it
    MergeCase("skip-bias-fp16", 3, 41, 2, 32, 1, 7, True, torch.float16, skip="skip-bias"),
    MergeCase("skip-order", 2, 40, 2, 32, 0, 9, False, skip="skip"),
]
MERGE_SLOW_CASES = [
    MergeCase("n577-fp16", 1, 577, 6, 64, 1, 40, True, torch.float16),  # NP 512: 5 A tiles, 9 B tiles, 3 chunks
    MergeCase("n577-order", 1, 577, 6, 64, 1, 8, False, size="none"),
    MergeCase("n1025-ties", 1, 1025, 3, 64, 1, 16, False, torch.float16, ties=True),  # n_A = 512 = NP
    MergeCase("np2048", 2, 197, 6, 64, 1, 8, False, config=(2048, 16)),  # the widest variant on a narrow image
]


def make_merge_inputs(case: MergeCase, seed: int = 0):
    """(x [T, C], qkv [T, 3*H*Dh], qkv_bias [3*H*Dh] or None, size [T] float32 or None, cu [B+1] int64)."""
    gen = torch.Generator().manual_seed(seed)
    B, n, H, Dh = case.B, case.n, case.H, case.Dh
    T, hd, C = B * n, H * Dh, case.C or H * Dh
    x = torch.randn(T, C, generator=gen)
    qkv = torch.randn(T, 3 * hd, generator=gen)
    bias = torch.randn(3 * hd, generator=gen) * 0.1
    if case.ties:
        patterns = (torch.randint(0, 2, (4, Dh), generator=gen) * 2 - 1).float() / math.sqrt(Dh)
        k = patterns[torch.randint(0, 4, (T,), generator=gen)].repeat(1, H)
        bias[hd : 2 * hd] = 0.0
    else:
        k = _planted_keys(gen, B, n, case.p, Dh).repeat(1, H) + 0.02 * torch.randn(T, hd, generator=gen)
        bias[hd : 2 * hd] *= 0.2
    qkv[:, hd : 2 * hd] = k
    if case.nan:
        a0, b0 = merge_sets(n, case.p)
        qkv[(B - 1) * n + (a0 if case.nan == "a" else b0) + 2, hd + 1] = math.nan
    if case.size == "none":
        size = None
    elif case.size == "int":
        size = torch.randint(1, 5, (T,), generator=gen).float()
    else:
        size = torch.rand(T, generator=gen) * 3 + 0.5
    cu = torch.arange(B + 1, dtype=torch.int64) * n
    return x.to(case.dtype), qkv.to(case.dtype), bias.to(case.dtype) if case.bias else None, size, cu


def make_skip_inputs(case: MergeCase, seed: int = 0) -> dict[str, torch.Tensor]:
    """{"skip": [T, C], "skip_bias": [C]} in the case's dtype as its `skip` asks ({} for "", no skip_bias for
    "skip"): keyword arguments of merge_tokens_reference and launch_merge."""
    if not case.skip:
        return {}
    gen = torch.Generator().manual_seed(seed + 1000)
    T, C = case.B * case.n, case.C or case.H * case.Dh
    out = {"skip": torch.randn(T, C, generator=gen).to(case.dtype)}
    if case.skip == "skip-bias":
        out["skip_bias"] = torch.randn(C, generator=gen).to(case.dtype)
    return out


def _planted_keys(gen: torch.Generator, B: int, n: int, p: int, Dh: int) -> torch.Tensor:
    """[B*n, Dh]: random directions; each A row = cos(t) * (a random B row of its image) + sin(t) * (its own
    direction), t uniform in [0, pi/2), scaled by 0.5..2."""
    keys = torch.randn(B, n, Dh, generator=gen)
    keys = keys / keys.norm(dim=-1, keepdim=True)
    a0, b0 = merge_sets(n, p)
    n_a, n_b = merge_widths(n, p)
    if n_a and n_b:
        pick = torch.randint(0, n_b, (B, n_a), generator=gen)
        target = keys[:, b0::2].gather(1, pick.unsqueeze(2).expand(B, n_a, Dh))
        t = torch.rand(B, n_a, 1, generator=gen) * (math.pi / 2)
        keys[:, a0::2] = torch.cos(t) * target + torch.sin(t) * keys[:, a0::2]
    return (keys * (0.5 + 1.5 * torch.rand(B, n, 1, generator=gen))).reshape(B * n, Dh)


def decision_margins(qkv, qkv_bias, B: int, n: int, H: int, p: int, r: int, class_token: bool) -> torch.Tensor:
    """[B] float64: per image the smallest score gap a decision depends on (inf without one): the best and the
    second best B score of every merged A row; the gap between the last merged and the first kept A row; without a
    class token every gap between consecutive kept A rows (their output order). Scores in float64 from the same
    inputs; a gap next to a NaN score counts as clear (NaN is the largest score in every implementation)."""
    T = B * n
    hd = qkv.shape[1] // 3
    k = qkv[:, hd : 2 * hd].cpu().double()
    if qkv_bias is not None:
        k = k + qkv_bias[hd : 2 * hd].cpu().double()
    metric = k.reshape(T, H, hd // H).mean(dim=1).reshape(B, n, -1)
    m = metric / metric.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    a0, b0 = merge_sets(n, p)
    scores = m[:, a0::2] @ m[:, b0::2].transpose(1, 2)  # [B, n_A, n_B]
    n_a, n_b = scores.shape[1:]
    out = torch.full((B,), math.inf, dtype=torch.float64)
    if n_a == 0 or n_b == 0:
        return out
    r_eff = merged_count(n, p, r)
    top = scores.topk(min(2, n_b), dim=2).values
    best, order = top[..., 0].sort(dim=1, descending=True, stable=True)
    gaps = [out]
    if n_b > 1 and r_eff:
        gaps.append((top[..., 0] - top[..., 1]).gather(1, order[:, :r_eff]).min(dim=1).values)
    steps = best[:, :-1] - best[:, 1:]  # [B, n_A - 1]: rank k to k + 1
    if 0 < r_eff < n_a:
        gaps.append(steps[:, r_eff - 1])
    if not class_token and n_a - r_eff > 1:
        gaps.append(steps[:, r_eff:].min(dim=1).values)
    return torch.stack(gaps).nan_to_num(nan=math.inf).min(dim=0).values


def _within_ulp(got: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """|got - ref| <= one ulp of ref in ref's dtype (fp16 / bf16: the rounding of an equal float32 value), per row."""
    ulp = (torch.nextafter(ref, torch.full_like(ref, math.inf)) - ref).float().abs()
    return ((got.float() - ref.float()).abs() <= ulp).all(dim=-1)


def compare_merge(got, ref, case_dtype: torch.dtype, size_kind: str, rows: torch.Tensor | None = None) -> dict:
    """{output: equal within its tolerance}: cu, src exact; size exact (size_kind "frac": rtol 1e-6); x within 1e-6
    (float32: relative, 1e-6 absolute floor) or one ulp of x's dtype; key_bias within 1e-6; score within 1e-6 (-inf
    and NaN equal). rows: [B*m] bool, output rows to compare (the images whose decisions are safe); None: all."""
    names = ("x", "size", "cu", "src", "key_bias", "score")
    g = dict(zip(names, (t.cpu() for t in got)))
    r = dict(zip(names, (t.cpu() for t in ref)))
    keep = slice(None) if rows is None else rows.cpu()
    out = {"cu": torch.equal(g["cu"], r["cu"]), "src": torch.equal(g["src"][keep], r["src"][keep])}
    out["shapes"] = all(g[k].shape == r[k].shape and g[k].dtype == r[k].dtype for k in names)
    if not out["shapes"]:
        return out
    gx, rx = g["x"][keep], r["x"][keep]
    if case_dtype == torch.float32:
        out["x"] = bool(torch.isclose(gx, rx, rtol=1e-6, atol=1e-6).all())
    else:
        out["x"] = bool(_within_ulp(gx, rx).all())
    gs, rs = g["size"][keep], r["size"][keep]
    out["size"] = bool(torch.isclose(gs, rs, rtol=1e-6, atol=0).all()) if size_kind == "frac" else torch.equal(gs, rs)
    out["key_bias"] = bool(torch.isclose(g["key_bias"][keep], r["key_bias"][keep], rtol=1e-6, atol=1e-6).all())
    out["score"] = bool(torch.isclose(g["score"], r["score"], rtol=0, atol=1e-6, equal_nan=True).all())
    return out
