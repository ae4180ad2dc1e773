"""torch.ops.raggedvit.select_rows (select_op.py) against an independent oracle written with Python loops and
sorted() (every policy, ties, B in {1, 3, 8}, capacity bounds), and against the compact stage's kept rows."""

from __future__ import annotations

import pytest
import torch

from raggedvit.pruning import PackedState, PruneSpec, packed_prune_stage
from raggedvit.pruning.select import SELECT_POLICIES
from raggedvit.pruning.select_op import select_rows, select_rows_op
from tests.support.select_cases import SELECT_CASES, SelectCase, make_select_inputs


def oracle(scores, cu, width, bound, p, k):
    """Rows of the capacity layout from each image's k by loops: kept slots (prefix + the k best patch slots by
    (-score, position)) image by image in position order, then every other slot in slot order."""
    B = cu.shape[0] - 1
    kept, other = [], []
    for b in range(B):
        lo, n = int(cu[b]), int(cu[b + 1] - cu[b])
        best = sorted(range(p, n), key=lambda j: (-float(scores[lo + j]), j))[: max(int(k[b]), 0)]
        chosen = set(range(min(n, p))) | set(best)
        seen = 0
        for j in range(width):
            seen += j in chosen
            row = (lo + j if j < n else 0, b, max(seen - 1, 0))
            (kept if j in chosen else other).append(row)
    counts = [0] * B
    for _, b, _ in kept:
        counts[b] += 1
    rows = (kept + other)[: B * bound]
    cu_new = torch.tensor([0] + counts).cumsum(0)
    return [torch.tensor([r[i] for r in rows], dtype=torch.int64) for i in range(3)], cu_new


@pytest.mark.parametrize("case", SELECT_CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("seed", [0, 1])
def test_op_equals_oracle(case, seed):
    scores, cu, bound = make_select_inputs(case, seed)
    args = (case.width, bound, case.num_prefix, case.policy, case.keep, case.mass)
    src, cu_new, seq_id, pos, k = select_rows_op(scores, cu, *args)
    (o_src, o_seq, o_pos), o_cu = oracle(scores, cu, case.width, bound, case.num_prefix, k)
    assert torch.equal(src, o_src) and torch.equal(seq_id, o_seq) and torch.equal(pos, o_pos)
    assert torch.equal(cu_new, o_cu)
    P = cu[1:] - cu[:-1] - case.num_prefix
    if case.policy == SELECT_POLICIES["count"]:
        want = torch.ceil(P.float() * case.keep).long().clamp_min(1).minimum(P)
        assert torch.equal(k, want)


@pytest.mark.parametrize("policy", ["topk-l2", "evit", "cls-mass"])
@pytest.mark.parametrize("B", [1, 3, 8])
def test_live_rows_equal_compact_stage(policy, B):
    """The op's live rows are the compact (nonzero) stage's rows: x, cu, seq_id, pos, token_index."""
    case = SelectCase("x", B, 40, 0, 1, 0, 0.4, 0.7, dead=5)
    scores, cu, _ = make_select_inputs(case, B)
    T = scores.shape[0]
    x = torch.randn(T, 3)
    index = torch.arange(T)
    state = PackedState(x, cu, torch.zeros(T, dtype=torch.int64), torch.zeros(T, dtype=torch.int64), index)
    spec = PruneSpec(policy, (1,), keep=0.4, mass=0.7)
    ref, trace = packed_prune_stage(state, scores, scores, 40, 1, spec)
    sel = select_rows(scores, cu, 40, 40, 1, spec)
    live = int(sel.cu[-1])
    assert torch.equal(sel.cu, ref.cu) and torch.equal(sel.k, trace.k)
    assert torch.equal(x[sel.src[:live]], ref.x) and torch.equal(sel.src[:live], ref.token_index)
    assert torch.equal(sel.seq_id[:live], ref.seq_id) and torch.equal(sel.pos[:live], ref.pos)


def test_checks_and_fake():
    scores, cu = torch.zeros(6), torch.tensor([0, 3, 6])
    with pytest.raises(ValueError, match="does not fuse"):
        select_rows(scores, cu, 3, 3, 1, PruneSpec("evit", (1,), fuse=True))
    with pytest.raises(ValueError, match=r"cu must be 1-D \[B\+1\] int64"):
        select_rows(scores, cu.int(), 3, 3, 1, PruneSpec("topk-l2", (1,)))
    with pytest.raises(ValueError, match="0 <= bound <= width"):
        select_rows(scores, cu, 3, 4, 1, PruneSpec("topk-l2", (1,)))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        out = select_rows_op(mode.from_tensor(scores), mode.from_tensor(cu), 3, 2, 1, 0, 0.5, 0.9)
    assert [tuple(t.shape) for t in out] == [(4,), (3,), (4,), (4,), (2,)]


def test_compile_fullgraph():
    scores, cu, bound = make_select_inputs(SELECT_CASES[1])
    spec = PruneSpec("cls-mass", (1,), mass=0.8)
    eager = select_rows(scores, cu, 70, bound, 1, spec)
    compiled = torch.compile(lambda s, c: select_rows(s, c, 70, bound, 1, spec), fullgraph=True, backend="eager")
    for a, b in zip(compiled(scores, cu), eager):
        assert torch.equal(a, b)


MASS_CASES = [c for c in SELECT_CASES if c.policy == SELECT_POLICIES["mass"]]


@pytest.mark.parametrize("case", MASS_CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mass_cases_stay_off_the_threshold(case, seed):
    """Every exclusive mass (float64) of the mass cases' inputs is > 1e-5 from `mass`: the float32 sums of the
    kernels (tile order) and of the CPU op (double) then give the same k (exact ties would not, DESIGN.md 3)."""
    scores, cu, _ = make_select_inputs(case, seed)
    mass = float(torch.tensor(case.mass, dtype=torch.float32))
    for b in range(case.B):
        v = scores[int(cu[b]) + case.num_prefix : int(cu[b + 1])].double().sort(descending=True).values
        excl = (v / v.sum()).cumsum(0) - v / v.sum()
        assert excl.numel() < 2 or float((excl[1:] - mass).abs().min()) > 1e-5, (b, excl.tolist())
