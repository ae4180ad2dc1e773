"""Fuzz cases of com.raggedvit::RaggedSelect on the CPU EP (call index % 10 == SELECT_AT of a fuzz run, through
`fuzz.linear.draw_any`): valid calls with dead rows, ties and capacity bounds (checked against the torch op's
CPU math, select_rows_reference), and every refusal kind (attributes, cu values, shapes, types)."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

import numpy as np

from fuzz.cases import cpu_session, refusal

__all__ = ["SELECT_AT", "SelectFuzzCase", "draw_select_case", "run_select_case", "select_expected_error"]

SELECT_AT = 2  # call i is a RaggedSelect case when i % 10 == SELECT_AT (never a RaggedLinear index: i % 5 == 4)
WIDTH_FLOOR = 1 << 16  # the op refuses width > max(T, WIDTH_FLOOR): slots past T only pad (a 2**30 width cost GiBs)
HUGE_WIDTHS = (WIDTH_FLOOR + 1, 1 << 30, 1 << 40)
_BREAKS = ("none",) * 6 + ("width", "bound", "policy", "prefix", "decreasing", "past_t", "too_long", "cu_rank",
           "fraction")  # fmt: skip


@dataclass(frozen=True)
class SelectFuzzCase:
    width: int
    bound: int
    num_prefix: int
    policy: int
    keep: float
    mass: float
    counts: tuple[int, ...]  # rows per image (cu = their cumsum)
    dead: int  # rows past cu[B]
    cu_break: str  # "none" or the breakage of cu
    seed: int

    def describe(self) -> str:
        return "RaggedSelect " + ", ".join(f"{k}={v!r}" for k, v in asdict(self).items())


def draw_select_case(seed: int, index: int) -> SelectFuzzCase:
    rng = random.Random(f"select/{seed}/{index}")
    brk = rng.choice(_BREAKS)
    width = rng.choice((1, 2, 7, 64, 65, 197, 300))
    p = rng.choice((0, 1, 1, 2))
    counts = tuple(rng.randint(min(p + 1, width), width) for _ in range(rng.choice((1, 2, 3, 8, 17))))
    bound = width if rng.random() < 0.5 else max(min(c, width) for c in counts)
    if brk == "width":
        width = rng.choice((0, -3))
    elif brk == "bound":
        bound = width + rng.randint(1, 5) if rng.random() < 0.5 else -1
    elif brk == "too_long":
        counts = (*counts[:-1], width + rng.randint(1, 9))
    policy = rng.choice((0, 1)) if brk != "policy" else rng.choice((2, -1))
    keep, mass = rng.choice((0.1, 0.5, 0.99, 1.0)), rng.choice((0.0, 0.5, 0.9, 1.0))
    if brk == "fraction":  # outside [0, 1] or (0, 1]: ceil(P * 1e20) overflows int64
        bad = rng.choice((0.0, 1.5, -0.1, 1e20, float("nan"), float("inf")))
        keep, mass = (bad, mass) if rng.random() < 0.5 else (keep, bad)
    dead, data_seed = rng.choice((0, 0, 3)), rng.randrange(2**31)
    if brk == "none" and rng.random() < 0.1:  # drawn last: the other cases keep their values
        width = rng.choice(HUGE_WIDTHS)
    return SelectFuzzCase(width, bound, -1 if brk == "prefix" else p, policy, keep, mass, counts, dead, brk, data_seed)


def select_expected_error(c: SelectFuzzCase) -> str | None:
    if c.width < 1 or not 0 <= c.bound <= c.width or c.num_prefix < 0 or c.policy not in (0, 1):
        return "select attributes"
    own, other = (c.keep, c.mass) if c.policy == 0 else (c.mass, c.keep)  # the policy's fraction, the unused one
    if not (0 < own <= 1 and 0 <= other <= 1):  # NaN fails both
        return "select fraction"
    if c.width > max(sum(c.counts) + c.dead, WIDTH_FLOOR):  # checked before the cu values
        return "select huge width"
    if c.cu_break in ("decreasing", "past_t", "too_long", "cu_rank"):
        return "select cu"
    return None


def _inputs(c: SelectFuzzCase) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(c.seed)
    cu = np.concatenate(([0], np.cumsum(c.counts))).astype(np.int64)
    T = int(cu[-1]) + c.dead
    # count policy: ties everywhere (exact); cls mass: continuous scores, since the CPU EP's sums may differ from
    # torch's in the last bit (DESIGN.md section 3) and tied multiples of 1/7 put prefix sums exactly on `mass`
    scores = (rng.integers(0, 6, T) / 7.0 if c.policy == 0 else rng.random(T)).astype(np.float32)
    if c.cu_break == "decreasing" and len(cu) > 2:
        cu[1] = cu[2] + 1
    elif c.cu_break in ("decreasing", "past_t"):
        cu[-1] = T + 1
    elif c.cu_break == "cu_rank":
        cu = cu.reshape(1, -1)
    return scores, cu


def run_select_case(c: SelectFuzzCase, sessions: dict) -> tuple[str, str | None]:
    """Runs `c`; (outcome, failure text or None) with the outcomes of `fuzz.cases.run_case`."""
    import torch

    from raggedvit.pruning.select import select_rows_reference
    from tests.support.ort_models import SELECT_OUTPUTS, select_model

    expected = select_expected_error(c)
    attrs = {"width": c.width, "bound": c.bound, "num_prefix": c.num_prefix, "policy": c.policy,
             "keep": c.keep, "mass": c.mass}  # fmt: skip
    key = repr(("select", sorted(attrs.items())))
    try:
        sess = cpu_session(sessions, key, lambda: select_model(attrs, any_rank=True))
    except Exception as e:  # noqa: BLE001 - classified by refusal
        return refusal(e, expected, "session")
    scores, cu = _inputs(c)
    try:
        got = sess.run(None, {"scores": scores, "cu": cu})
    except Exception as e:  # noqa: BLE001 - classified by refusal
        return refusal(e, expected, "run")
    if expected is not None:
        return "failed", f"invalid input accepted ({expected})"
    args = (c.width, c.bound, c.num_prefix, c.policy, c.keep, c.mass)
    ref = select_rows_reference(torch.from_numpy(scores), torch.from_numpy(cu), *args)
    for name, g, r in zip(SELECT_OUTPUTS, got, ref):
        if not np.array_equal(g, r.numpy()):
            return "failed", f"output {name} differs from select_rows_reference"
    return "checked", None
