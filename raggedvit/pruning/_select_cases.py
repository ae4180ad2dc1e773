"""Seeded inputs of the selection op (`select_rows`, RaggedSelect) shared by its tests, the interpreter run of its
Triton kernels and the CPU fuzz: packed scores with many ties, per-image counts, capacity bounds."""

from __future__ import annotations

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
]


def make_select_inputs(case: SelectCase, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(scores [T] float32 with ties, cu [B+1] int64 with n_b in (p, width], bound) for a case."""
    gen = torch.Generator().manual_seed(seed)
    lo = min(case.num_prefix + 1, case.width)
    n = torch.randint(lo, case.width + 1, (case.B,), generator=gen)
    if case.bound:  # a capacity below the width must hold every image's kept count
        n = torch.clamp(n, max=case.width)
    cu = torch.cat((torch.zeros(1, dtype=torch.int64), n.cumsum(0)))
    T = int(cu[-1]) + case.dead
    scores = torch.randint(0, 6, (T,), generator=gen).to(torch.float32) / 7.0  # ties everywhere
    return scores, cu, case.bound or case.width
