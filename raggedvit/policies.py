"""The pruning policies: one descriptor per policy, the only place that knows a policy by its name (torch-free: the
CLI and the graph checks read it without importing torch). `raggedvit.pruning.PruneSpec` validates specs against it;
the CLI, sweep, validators, coverage and exporter ask a descriptor (`get_policy(name)`) what a policy does. The kernels'
integer policy attribute (RaggedSelect's count / mass) stays in kernels/ and custom_ops/."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "CLS_ATTN_POLICIES",
    "COUNT_POLICIES",
    "MERGE_POLICIES",
    "POLICIES",
    "POLICY_PARAMS",
    "REGISTRY",
    "Policy",
    "counts_known",
    "get_policy",
    "has_dead_rows",
    "static_shapes",
]


@dataclass(frozen=True)
class Policy:
    """What one policy is.

    name: the policy's name (`--policy`, PruneSpec.policy, the recipe).
    params: the PruneSpec fields it reads besides prune_at: the keys of a sweep grid and the CLI options it takes.
    default_at: its stages' blocks when none are given: "4" (one stage before block 4), "3,6,9" (EViT's and
        DynamicViT's published locations), "every" (every block: a merging policy's stages run inside the blocks), ""
        (a policy with no stages).
    where: "between" blocks (a stage before block i selects rows), "inside" a block (after its attention residual,
        before its MLP), or "none".
    scorer: what ranks the tokens: "l2" (the squared L2 norm of each row), "cls" (the class token's attention: in
        the block before a "between" stage, in the stage's own block for an "inside" one), "similarity" (ToMe's key
        similarity), "predictor" (a learned module's log-probability of keeping each token), or "none".
    cut: how many tokens a stage keeps: "count" (ceil(keep * patches), known before the data), "mass" (the fewest
        reaching a cumulative cls-attention mass: data-dependent), "schedule" (int(P * keep^(s+1)) at stage s, P the
        patch tokens before any stage: DynamicViT's), "merge" (r fewer per block), or "none".
    learned: the policy has parameters of its own (a predictor loaded with the checkpoint: `state_prefix` names its
        keys there).
    exact_count: a "count" cut is ceil(keep * patches) in double precision (EViT's code), not in float32.
    defaults: its parameters' default values (EViT's and DynamicViT's published keep rate 0.7).
    """

    name: str
    params: tuple[str, ...]
    default_at: str
    where: Literal["between", "inside", "none"]
    scorer: Literal["l2", "cls", "similarity", "predictor", "none"]
    cut: Literal["count", "mass", "schedule", "merge", "none"]
    learned: bool = False
    state_prefix: str = ""
    exact_count: bool = False
    defaults: tuple[tuple[str, Any], ...] = ()

    def default(self, param: str) -> Any:
        """The policy's default value of one of its parameters (the CLI's, where the user gives none)."""
        return dict(self.defaults)[param]

    @property
    def prunes(self) -> bool:
        """The policy has stages (every policy but "none")."""
        return self.where != "none"

    @property
    def merges(self) -> bool:
        """Its stages merge tokens inside the blocks (tome) instead of selecting rows."""
        return self.cut == "merge"

    @property
    def needs_cls_attn(self) -> bool:
        """It ranks by the class token's attention: the model needs a class token."""
        return self.scorer == "cls"

    def counts_known(self, fuse: bool = False) -> bool:
        """Every stage keeps a count known before the data (a fused token depends on the data's drops only in the
        compact layout: evit with fuse is not counted)."""
        fused = fuse and "fuse" in self.params
        return self.cut in ("none", "merge", "schedule") or (self.cut == "count" and not fused)

    def label(self, values: Mapping[str, Any]) -> str:
        """One line for a spec of this policy (its PruneSpec fields as a dict, prune_at resolved or not), as the
        report and the sweep print it: "topk-l2 keep=0.5 at=4", "evit keep=0.7 fuse at=3,6,9", "tome r=8" (every
        block), "cls-mass mass=0.9 at=3,6,9", "none"."""
        words = [self.name]
        for key in self.params:
            value = values.get(key)
            if isinstance(value, bool):
                words += [key] if value else []
            else:
                words.append(f"{key}={_show(value)}")
        at = list(values.get("prune_at") or ())
        if self.prunes and at:
            words.append(f"at={','.join(str(i) for i in at)}")
        return " ".join(words)


def _show(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


REGISTRY: dict[str, Policy] = {
    p.name: p
    for p in (
        Policy("none", (), "", "none", "none", "none"),
        Policy("topk-l2", ("keep",), "4", "between", "l2", "count", defaults=(("keep", 0.5),)),
        Policy(
            "evit",
            ("keep", "fuse"),
            "3,6,9",
            "inside",
            "cls",
            "count",
            exact_count=True,
            defaults=(("keep", 0.7), ("fuse", False)),
        ),  # fmt: skip
        Policy("cls-mass", ("mass",), "4", "between", "cls", "mass", defaults=(("mass", 0.9),)),
        Policy("tome", ("r",), "every", "inside", "similarity", "merge", defaults=(("r", 8),)),
        Policy(
            "dynamicvit",
            ("keep",),
            "3,6,9",
            "between",
            "predictor",
            "schedule",
            learned=True,
            state_prefix="score_predictor.",
            defaults=(("keep", 0.7),),
        ),  # fmt: skip
    )
}


def get_policy(name: str) -> Policy:
    """The descriptor of a policy; ValueError naming the known ones for another name."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown pruning policy {name!r}; expected one of {', '.join(REGISTRY)}") from None


POLICIES = tuple(REGISTRY)
CLS_ATTN_POLICIES = tuple(n for n, p in REGISTRY.items() if p.needs_cls_attn)  # need a class token
COUNT_POLICIES = tuple(n for n, p in REGISTRY.items() if p.cut == "count")  # ceil(keep * patches) per image
MERGE_POLICIES = tuple(n for n, p in REGISTRY.items() if p.merges)  # merge inside the blocks (ToMe)
# The PruneSpec fields each policy reads besides prune_at: the keys of a `raggedvit sweep` grid
# (raggedvit.sweep.grid), and the options the CLI refuses for the other policies.
POLICY_PARAMS = {n: p.params for n, p in REGISTRY.items()}


def static_shapes(policy: str, fuse: bool = False, capacity: bool = False) -> bool:
    """The traced graph has static shapes at a given batch size (no NonZero) and runs as a CUDA graph: in the
    capacity layout (PrunedViT(..., capacity=True)) every policy; in the compact layout the policies whose every
    stage keeps a count known before the data (topk-l2, evit without fuse, none)."""
    return capacity or counts_known(policy, fuse)


def counts_known(policy: str, fuse: bool = False) -> bool:
    """Every stage keeps a token count known before the data and the uniform stage runs it (topk-l2, evit without
    fuse, none; tome merges a fixed number per block): token_counts is then an export-time constant, whatever the
    layout."""
    return REGISTRY[policy].counts_known(fuse)


def has_dead_rows(policy: str, capacity: bool) -> bool:
    """Blocks run on rows past cu[B] (dead rows): the capacity layout after a stage whose counts depend on the data
    (cls-mass). Count policies keep exact capacities (p + k per image, + the evit fused token), and tome's counts
    are fixed, so never."""
    return capacity and REGISTRY[policy].cut == "mass"
