"""The default rule per export dtype, and which moved cuts are precision ties."""

from __future__ import annotations

import pytest

from raggedvit.pruning import PruneSpec
from raggedvit.validators import (
    PRECISION_TIE_ULPS,
    NearTie,
    Thresholds,
    ValidationInputError,
    first_moved_stage,
    precision_tie,
    precision_tie_eps,
)
from raggedvit.validators.report import TokenSwap
from raggedvit.validators.ties import precision_swap


def test_fp32_default_is_the_absolute_bar():
    th = Thresholds.for_dtype("fp32")
    assert (th.max_abs_logit, th.rel_logit, th.precision_eps) == (0.004, 0.0, None)
    assert th.atol_default and th.rtol_default and th.dtype == "fp32"
    assert th.passes(0.0039, 50.0) and not th.passes(0.004, 50.0)  # strictly below, whatever the logit scale
    assert th.text() == "max |Δlogit| < 0.004 [atol 0.004 (default), rtol 0 (default) for fp32 exports]"


@pytest.mark.parametrize("dtype", ["fp16", "fp16-all"])
def test_fp16_default_is_mixed_and_has_precision_ties(dtype):
    th = Thresholds.for_dtype(dtype)
    assert (th.max_abs_logit, th.rel_logit) == (0.004, 0.01)
    assert th.precision_eps == precision_tie_eps(dtype) == PRECISION_TIE_ULPS * 2.0**-10
    assert th.bound(3.0) == pytest.approx(0.034)
    assert th.passes(0.034 - 1e-12, 3.0) and not th.passes(0.0341, 3.0)
    assert th.text().startswith("max |Δlogit| ≤ 0.004 + 0.01 x max |reference logit| [atol 0.004 (default)")
    assert "precision tie: a moved cut with margin < 0.00391 (4 fp16 ulps)" in th.tie_text()
    d = th.to_dict()
    assert d["dtype"] == dtype and d["atol_default"] and d["rtol_default"] and d["rule"] == th.text()


def test_overrides_are_reported_as_given():
    th = Thresholds.for_dtype("fp16", atol=0.01, rtol=0.0)
    assert (th.max_abs_logit, th.rel_logit, th.atol_default, th.rtol_default) == (0.01, 0.0, False, False)
    assert th.text() == "max |Δlogit| < 0.01 [atol 0.01 (given), rtol 0 (given) for fp16 exports]"
    assert th.precision_eps is not None  # precision ties follow the dtype, not the logit bar
    th = Thresholds.for_dtype("fp32", rtol=0.01)
    assert (th.max_abs_logit, th.atol_default, th.rtol_default) == (0.004, True, False)
    with pytest.raises(ValidationInputError, match="export dtype 'bf16' has no default tolerance"):
        Thresholds.for_dtype("bf16")


def test_first_moved_stage():
    assert first_moved_stage([78, 30, 19], [78, 30, 19]) is None
    assert first_moved_stage([78, 30, 18], [78, 30, 19]) == 2
    assert first_moved_stage([77, 31, 18], [78, 30, 19]) == 0


def test_precision_swap_needs_one_token_and_a_small_gap():
    """The first stage where the export kept other tokens at equal counts: a precision tie only if it swapped one
    token whose reference score lies within the dtype's margin of the token kept instead (fp32: never)."""
    eps = precision_tie_eps("fp16")
    one = TokenSwap(0, 0, 3, 1, 0.2 * eps)
    assert precision_swap(one, eps) == NearTie(0, 0, 3, "swap", one.gap)
    assert precision_swap(TokenSwap(0, 1, 6, 2, 0.1 * eps), eps) is None  # two tokens at a cut
    assert precision_swap(TokenSwap(0, 1, 6, 1, 2 * eps), eps) is None  # a gap beyond rounding
    assert precision_swap(one, None) is None


def test_precision_tie_needs_cls_mass_one_token_and_a_small_margin():
    eps = precision_tie_eps("fp16")
    margins = [NearTie(0, 0, 3, "score", 1e-4), NearTie(0, 0, 3, "mass", 0.9 * eps), NearTie(0, 1, 6, "mass", 0.5)]
    mass = PruneSpec("cls-mass", (3, 6))
    assert precision_tie(margins, 0, -1, mass, eps) == margins[1]
    assert precision_tie(margins, 0, +2, mass, eps) is None  # two tokens: more than rounding at the cut
    assert precision_tie(margins, 1, +1, mass, eps) is None  # the margin at stage 1 is far from the cut
    assert precision_tie(margins, 0, -1, mass, None) is None  # fp32: no precision ties
    # topk-l2 keeps ceil(P * keep) whatever the scores: a small score gap never explains a moved count
    assert precision_tie(margins, 0, 1, PruneSpec("topk-l2", (3, 6)), eps) is None
