"""Seeded inputs of the selection op (`select_rows`, RaggedSelect) shared by its tests, the interpreter run of its
Triton kernels and the CPU fuzz: packed scores with many ties, per-image counts, capacity bounds.

Count cases draw multiples of 1/7 (ties everywhere; k does not depend on the scores' values). Mass cases draw
logs of primes: a prefix of an image's sorted scores then has a rational share of the image's sum only when every
patch score of the image is the same value (the logs of distinct primes are linearly independent over the
rationals), and such images get one score changed. So no exclusive mass lands exactly on a threshold, where float
summation order (CPU op: double; kernels: float32 in tile order) would decide k (DESIGN.md section 3).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

__all__ = ["SELECT_CASES", "SelectCase", "make_select_inputs"]


class SelectCase(NamedTuple):
    name: str
    B: int
    width: int
    bound: int  # 0: the width
    num_prefix: int
    policy: int  # SELECT_POLICIES code
    keep: float
    mass: float
    dead: int = 0  # extra rows past cu[B]


SELECT_CASES = [
    SelectCase("b1-count", 1, 10, 0, 1, 0, 0.5, 0.9),
    SelectCase("b3-mass", 3, 70, 0, 1, 1, 0.5, 0.8, dead=7),
    SelectCase("b3-count-bound", 3, 70, 38, 2, 0, 0.5, 0.9),
    SelectCase("b8-mass", 8, 20, 0, 1, 1, 0.5, 0.5, dead=3),
    SelectCase("b8-count-p0", 8, 33, 0, 0, 0, 0.3, 0.9),
    SelectCase("b3-mass-wide", 3, 197, 0, 1, 1, 0.5, 0.9),
    SelectCase("b1-mass-all", 1, 65, 0, 4, 1, 0.5, 1.0),
    SelectCase("b2-mass-w300", 2, 300, 0, 1, 1, 0.5, 0.9, dead=5),  # the kernels' sort width 512
]


_LOG_PRIMES = tuple(math.log(q) for q in (2, 3, 5, 7, 11, 13))


def make_select_inputs(case: SelectCase, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(scores [T] float32 with ties, cu [B+1] int64 with n_b in (p, width], bound) for a case (scores of the
    mass policy: logs of primes)."""
    gen = torch.Generator().manual_seed(seed)
    lo = min(case.num_prefix + 1, case.width)
    n = torch.randint(lo, case.width + 1, (case.B,), generator=gen)
    if case.bound:  # a capacity below the width must hold every image's kept count
        n = torch.clamp(n, max=case.width)
    cu = torch.cat((torch.zeros(1, dtype=torch.int64), n.cumsum(0)))
    T = int(cu[-1]) + case.dead
    draw = torch.randint(0, 6, (T,), generator=gen)
    if case.policy != 1:
        return draw.to(torch.float32) / 7.0, cu, case.bound or case.width  # ties everywhere
    for b in range(case.B):  # an image whose patch scores are all equal: one of them differs
        patch = draw[int(cu[b]) + case.num_prefix : int(cu[b + 1])]
        if patch.numel() > 1 and bool((patch == patch[0]).all()):
            patch[-1] = (patch[0] + 1) % 6
    scores = torch.tensor(_LOG_PRIMES, dtype=torch.float32)[draw]  # ties, no rational masses
    return scores, cu, case.bound or case.width
