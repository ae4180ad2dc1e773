"""The shared selection function (DESIGN.md section 4 steps 2-6) on constructed cases."""

from __future__ import annotations

import math

import torch

from raggedvit.pruning import PackedState, PruneSpec, packed_prune_stage, pad_scores, select_tokens

INF = math.inf


def test_ties_go_to_the_lower_position() -> None:
    S = torch.tensor([[-INF, 1.0, 2.0, 2.0, 1.0, 2.0, -INF]])  # p = 1, n = 6, one padding slot
    sel = select_tokens(S, torch.tensor([6]), 1, PruneSpec("topk-l2", (1,), keep=0.4))  # k = ceil(0.4 * 5) = 2
    assert sel.k.tolist() == [2]
    assert sel.keep.tolist() == [[True, False, True, True, False, False, False]]
    assert sel.rank[0, 1:6].tolist() == [3, 0, 1, 4, 2]


def test_topk_counts_clamp_and_prefix() -> None:
    S = torch.tensor([[-INF, -INF, 3.0, 1.0, 2.0, -INF], [-INF, -INF, 5.0, 4.0, 6.0, 7.0]])  # p = 2
    n = torch.tensor([5, 6])
    sel = select_tokens(S, n, 2, PruneSpec("topk-l2", (1,), keep=0.01))  # ceil -> 1, at least one patch kept
    assert sel.k.tolist() == [1, 1]
    assert sel.keep.tolist() == [[True, True, True, False, False, False], [True, True, False, False, False, True]]
    full = select_tokens(S, n, 2, PruneSpec("topk-l2", (1,), keep=1.0))
    assert full.keep.tolist() == [[True] * 5 + [False], [True] * 6]


def test_cls_mass_uses_exclusive_cumsum() -> None:
    # normalised patch scores 0.5, 0.3, 0.2 -> exclusive cumsum 0, 0.5, 0.8
    S = torch.tensor([[-INF, 0.2, 0.5, 0.3]])
    n = torch.tensor([4])
    for mass, k in [(0.4, 1), (0.5, 1), (0.6, 2), (0.8, 2), (0.81, 3), (1.0, 3)]:
        sel = select_tokens(S, n, 1, PruneSpec("cls-mass", (1,), mass=mass))
        assert sel.k.tolist() == [k], (mass, sel.k)
    sel = select_tokens(S, n, 1, PruneSpec("cls-mass", (1,), mass=0.6))
    assert sel.keep.tolist() == [[True, False, True, True]]


def test_cls_mass_zero_scores_keep_everything() -> None:
    S = torch.tensor([[-INF, 0.0, 0.0, -INF]])
    sel = select_tokens(S, torch.tensor([3]), 1, PruneSpec("cls-mass", (1,), mass=0.5))
    assert sel.keep.tolist() == [[True, True, True, False]]


def _state(n: list[int], C: int = 3) -> PackedState:
    T = sum(n)
    cu = torch.tensor([0] + n).cumsum(0)
    seq = torch.repeat_interleave(torch.arange(len(n)), torch.tensor(n))
    pos = torch.arange(T) - cu[seq]
    x = torch.arange(T * C, dtype=torch.float32).reshape(T, C)
    return PackedState(x, cu, seq, pos, pos.clone())


def test_packed_stage_equal_scores_keep_first_patches() -> None:
    state = _state([5, 4])
    new, trace = packed_prune_stage(state, torch.ones(9), None, 5, 1, PruneSpec("topk-l2", (1,), keep=0.5))
    assert trace.kept.tolist() == [3, 3]  # prefix + ceil(0.5 * 4) = 2, prefix + ceil(0.5 * 3) = 2
    assert new.cu.tolist() == [0, 3, 6]
    assert new.token_index.tolist() == [0, 1, 2, 0, 1, 2]
    assert new.seq_id.tolist() == [0, 0, 0, 1, 1, 1]
    assert new.pos.tolist() == [0, 1, 2, 0, 1, 2]
    assert torch.equal(new.x, state.x[[0, 1, 2, 5, 6, 7]])


def test_packed_stage_evit_fuse_token() -> None:
    state = _state([5, 3])
    cls_attn = torch.tensor([0.5, 0.1, 0.2, 0.15, 0.05, 0.6, 0.3, 0.1])
    new, trace = packed_prune_stage(state, cls_attn, cls_attn, 6, 1, PruneSpec("evit", (1,), keep=0.5, fuse=True))
    assert trace.kept.tolist() == [4, 3]
    assert new.token_index.tolist() == [0, 2, 3, -1, 0, 1, -1]
    x = state.x
    fused0 = 0.1 * x[1] + 0.05 * x[4]  # EViT: the attention-weighted sum of the dropped rows, not renormalised
    torch.testing.assert_close(new.x[3], fused0)
    torch.testing.assert_close(new.x[6], 0.1 * x[7])  # one dropped row: that row times its attention
    S = pad_scores(cls_attn, state.cu, torch.tensor([5, 3]), 6, 1)
    assert S[0, 0] == -INF and S[1, 3:].eq(-INF).all() and S[1, 1] == 0.3
