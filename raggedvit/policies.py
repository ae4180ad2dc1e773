"""The pruning policies and which of them keep export-time-known token counts (torch-free: the CLI and the graph
checks read it without importing torch). `raggedvit.pruning.PruneSpec` validates specs against these."""

from __future__ import annotations

__all__ = [
    "CLS_ATTN_POLICIES",
    "COUNT_POLICIES",
    "MERGE_POLICIES",
    "POLICIES",
    "POLICY_PARAMS",
    "counts_known",
    "has_dead_rows",
    "static_shapes",
]

POLICIES = ("none", "topk-l2", "evit", "cls-mass", "tome")
CLS_ATTN_POLICIES = ("evit", "cls-mass")  # rank by the class token's attention: need a class token
COUNT_POLICIES = ("topk-l2", "evit")  # keep ceil(keep * patches) tokens per image, whatever the scores
MERGE_POLICIES = ("tome",)  # merge tokens inside the blocks (ToMe): min(r, patches // 2) fewer per merging block
# The PruneSpec fields each policy reads besides prune_at (which every policy but "none" reads): the keys of a
# `raggedvit sweep` grid (raggedvit.sweep.grid), and the options the CLI refuses for the other policies.
POLICY_PARAMS = {"none": (), "topk-l2": ("keep",), "evit": ("keep", "fuse"), "cls-mass": ("mass",), "tome": ("r",)}


def static_shapes(policy: str, fuse: bool = False, capacity: bool = False) -> bool:
    """The traced graph has static shapes at a given batch size (no NonZero) and runs as a CUDA graph: in the
    capacity layout (PrunedViT(..., capacity=True)) every policy; in the compact layout the policies whose every
    stage keeps a count known before the data (topk-l2, evit without fuse, none)."""
    return capacity or counts_known(policy, fuse)


def counts_known(policy: str, fuse: bool = False) -> bool:
    """Every stage keeps a token count known before the data and the uniform stage runs it (topk-l2, evit without
    fuse, none; tome merges a fixed number per block): token_counts is then an export-time constant, whatever the
    layout."""
    return policy in ("none", "topk-l2", *MERGE_POLICIES) or (policy == "evit" and not fuse)


def has_dead_rows(policy: str, capacity: bool) -> bool:
    """Blocks run on rows past cu[B] (dead rows): the capacity layout after a stage whose counts depend on the data
    (cls-mass). Count policies keep exact capacities (p + k per image, + the evit fused token), and tome's counts
    are fixed, so never."""
    return capacity and policy not in ("none", *COUNT_POLICIES, *MERGE_POLICIES)
