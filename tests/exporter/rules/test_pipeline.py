"""The order of raggedvit/exporter/rules (`PIPELINE`): every step has a reason, the ordering constraints the
reasons state hold, and every rule and pass has a direct test in this package."""

from __future__ import annotations

from pathlib import Path

from raggedvit.exporter.rules import PIPELINE, rule_names


def _position(name: str) -> int:
    return rule_names().index(name)


def test_every_step_says_why_it_runs_there():
    assert all(step.reason and (step.rules is None) != (step.run is None) for step in PIPELINE)
    assert len({step.name for step in PIPELINE}) == len(PIPELINE)


def test_order_constraints():
    before = [
        ("fold_weight_layout", "patch_embed"),
        ("gemm_to_matmul", "bias_gelu"),
        ("gemm_to_matmul", "skip_layer_norm"),
        ("patch_bias_into_position", "patch_embed"),
        ("bias_gelu", "zero_bias_gelu"),
        ("skip_layer_norm", "skip_layer_norm_plain"),
        ("skip_layer_norm_cast", "skip_layer_norm_plain"),
        ("ragged_linear_skip_layer_norm", "layer_norm_rows"),
        ("gather_layer_norm", "layer_norm_rows"),
    ]
    for first, then in before:
        assert _position(first) < _position(then), (first, then)
    norms = [n for n in rule_names() if "layer_norm" in n]
    assert norms[-1] == "layer_norm_rows"


def test_every_rule_has_a_direct_test():
    """Each pass and rule name occurs in a test module of tests/exporter/rules other than this one (the name of the
    test function that runs it on a hand-built graph, or the name the test gives the rule)."""
    here = Path(__file__)
    sources = "".join(p.read_text() for p in here.parent.glob("test_*.py") if p != here)
    missing = [name for name in rule_names() if name not in sources]
    assert not missing, missing
