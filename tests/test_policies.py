"""raggedvit.policies: one descriptor per policy, and the rest of the package asks it instead of testing names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from raggedvit import policies
from raggedvit.policies import REGISTRY, get_policy
from raggedvit.pruning import PruneSpec

ROOT = Path(__file__).resolve().parent.parent
# a test of a policy by its name: compared with a string, or looked up in a tuple of names
NAME_TEST = re.compile(
    r"""policy\s*(==|!=|\bin\b|\bnot in\b)\s*(["']|\(\s*["']|(CLS_ATTN_|COUNT_|MERGE_)?POLICIES\b|POLICY_PARAMS\b)"""
)


def test_outside_the_registry_no_module_tests_a_policy_by_name() -> None:
    """At most 5 lines of raggedvit/ outside policies.py, kernels/ and custom_ops/ (the kernels' integer policy
    attribute) test a policy by name; today none does."""
    hits = [
        f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
        for path in sorted((ROOT / "raggedvit").rglob("*.py"))
        if path.name != "policies.py" and not {"kernels", "custom_ops"} & set(path.relative_to(ROOT).parts)
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if NAME_TEST.search(line)
    ]
    assert len(hits) <= 5, "\n".join(hits)
    assert hits == []


def test_the_pattern_sees_the_forms_it_counts() -> None:
    for line in ('if spec.policy == "none":', "x = policy in COUNT_POLICIES", 'policy not in ("a", "b")'):
        assert NAME_TEST.search(line), line
    assert not NAME_TEST.search('if policy == SELECT_POLICIES["count"]:')  # the kernels' integer code


def test_descriptors() -> None:
    assert policies.POLICIES == ("none", "topk-l2", "evit", "cls-mass", "tome", "dynamicvit")
    assert [n for n, p in REGISTRY.items() if p.needs_cls_attn] == ["evit", "cls-mass"]
    assert [n for n, p in REGISTRY.items() if p.merges] == ["tome"]
    assert [n for n, p in REGISTRY.items() if p.where == "inside"] == ["evit", "tome"]  # EViT prunes in its block
    assert not get_policy("none").prunes and all(p.prunes for n, p in REGISTRY.items() if n != "none")
    assert [(n, p.state_prefix) for n, p in REGISTRY.items() if p.learned] == [("dynamicvit", "score_predictor.")]
    assert get_policy("evit").default_at == get_policy("dynamicvit").default_at == "3,6,9"  # the papers' blocks
    assert {n: p.counts_known(False) for n, p in REGISTRY.items()} == {
        "none": True, "topk-l2": True, "evit": True, "cls-mass": False, "tome": True, "dynamicvit": True
    }  # fmt: skip
    assert not get_policy("evit").counts_known(fuse=True) and get_policy("topk-l2").counts_known(fuse=True)
    with pytest.raises(ValueError, match="unknown pruning policy 'nope'; expected one of none, topk-l2"):
        get_policy("nope")


def test_one_label_for_the_sweep_and_the_report() -> None:
    from raggedvit.sweep import point_label
    from raggedvit.validators.report import _prune_text

    for spec, label in [
        (PruneSpec("topk-l2", (3, 6, 9), keep=0.3), "topk-l2 keep=0.3 at=3,6,9"),
        (PruneSpec("evit", (4,), keep=0.7, fuse=True), "evit keep=0.7 fuse at=4"),
        (PruneSpec("cls-mass", (3,), mass=0.9), "cls-mass mass=0.9 at=3"),
        (PruneSpec("tome", r=8), "tome r=8"),
        (PruneSpec("dynamicvit", (3, 6, 9), keep=0.7), "dynamicvit keep=0.7 at=3,6,9"),
        (PruneSpec(), "none"),
    ]:
        assert point_label(spec) == _prune_text(spec.to_dict()) == label


def test_default_blocks_come_from_the_descriptor() -> None:
    assert PruneSpec.from_strings("topk-l2").prune_at == (4,)
    assert PruneSpec.from_strings("evit").prune_at == PruneSpec.from_strings("dynamicvit").prune_at == (3, 6, 9)
    assert PruneSpec.from_strings("tome", r=8).prune_at == () and PruneSpec.from_strings("none").prune_at == ()
