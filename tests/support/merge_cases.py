"""Seeded inputs of the merge op (`merge_tokens_reference`, com.raggedvit::RaggedMerge) shared by its tests: uniform
images of n rows, sizes as after earlier merges (integer-valued floats >= 1), and tie cases whose cosines are exact.

Tie cases draw every head's key from the 16 vectors of {-1, 1}^4 (norm 2: the normalised entries are +-0.5 and every
cosine, a multiple of 1/4, is exact in any summation order), so equal scores are equal in every implementation and
the tie rules (lowest B index per A row, lower A index first in the sort) alone decide.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["MERGE_CASES", "MergeCase", "make_merge_inputs", "merge_attrs"]


class MergeCase(NamedTuple):
    name: str
    B: int
    n: int
    H: int
    Dh: int
    C: int
    num_prefix: int
    r: int
    ties: bool = False  # keys from {-1, 1}^4 (Dh must be 4)


MERGE_CASES = [
    MergeCase("deit_small-b8", 8, 197, 6, 64, 384, 1, 8),
    MergeCase("deit_small-b1", 1, 197, 6, 64, 384, 1, 8),
    MergeCase("p0-b3", 3, 196, 3, 16, 40, 0, 13),
    MergeCase("distilled-b3", 3, 198, 3, 16, 24, 2, 16),
    MergeCase("registers-b3", 3, 21, 1, 8, 12, 5, 3),
    MergeCase("r0", 3, 12, 3, 4, 8, 1, 0),
    MergeCase("clamped-odd-patches", 3, 16, 1, 8, 8, 1, 100),  # 15 patch rows: r_eff 7, n_A 7, n_B 8
    MergeCase("clamped-even-patches", 8, 16, 3, 4, 8, 2, 7),  # r = (n - p) / 2 exactly
    MergeCase("p5-odd", 1, 40, 6, 4, 16, 5, 9),
    MergeCase("no-b-row", 3, 3, 1, 4, 8, 2, 4),  # n - p = 1: n_B 0, scores -inf, nothing merges
    MergeCase("prefix-only", 3, 2, 1, 4, 8, 2, 4),  # n = p: n_A = n_B = 0
    MergeCase("one-b-row", 3, 2, 3, 4, 8, 1, 4),  # n - p = 1 with p odd: n_A 0, n_B 1
    MergeCase("small-n", 8, 5, 3, 4, 8, 0, 2),
    MergeCase("ties-b8", 8, 33, 2, 4, 8, 1, 6, ties=True),
    MergeCase("ties-p0", 3, 32, 1, 4, 8, 0, 16, ties=True),  # r_eff = n_A: every A row merges
    MergeCase("ties-p2", 3, 31, 3, 4, 8, 2, 5, ties=True),
]


def merge_attrs(case: MergeCase, class_token: bool) -> dict[str, int]:
    """The node attributes of a case."""
    return {"num_heads": case.H, "num_prefix": case.num_prefix, "r": case.r, "class_token": int(class_token)}


def make_merge_inputs(
    case: MergeCase,
    seed: int = 0,
    *,
    dtype: torch.dtype = torch.float32,
    bias: bool = True,
    size: bool = True,
    skip: bool = False,
    skip_bias: bool = False,
) -> dict[str, torch.Tensor | None]:
    """x [T, C], qkv [T, 3*H*Dh], qkv_bias [3*H*Dh] (or None), size [T] float32 integer-valued in [1, 6] (or None),
    cu [B+1] int64 = b*n, for a case; with skip also skip [T, C] and skip_bias [C] (or None): the attention branch the
    op adds to x first. A tie case has every head's key in {-1, 1}^4 and a zero k bias."""
    gen = torch.Generator().manual_seed(seed)
    T, HD = case.B * case.n, case.H * case.Dh
    x = torch.randn(T, case.C, generator=gen)
    qkv = torch.randn(T, 3 * HD, generator=gen)
    qkv_bias = torch.randn(3 * HD, generator=gen) * 0.5
    if case.ties:
        assert case.Dh == 4, "tie cases use the vectors of {-1, 1}^4"
        codes = torch.randint(0, 16, (T,), generator=gen)
        signs = ((codes.unsqueeze(1) >> torch.arange(4)) & 1).float() * 2 - 1  # [T, 4]
        qkv[:, HD : 2 * HD] = signs.repeat(1, case.H)
        qkv_bias[HD : 2 * HD] = 0
    sizes = torch.randint(1, 7, (T,), generator=gen).float()
    out = {
        "x": x.to(dtype),
        "qkv": qkv.to(dtype),
        "qkv_bias": qkv_bias.to(dtype) if bias else None,
        "size": sizes if size else None,
        "cu": torch.arange(case.B + 1, dtype=torch.int64) * case.n,
    }
    if skip:
        out["skip"] = torch.randn(T, case.C, generator=gen).to(dtype)
        out["skip_bias"] = torch.randn(case.C, generator=gen).to(dtype) if skip_bias else None
    return out
