"""Token-pruned timm ViTs on packed variable-length tokens (DESIGN.md section 4)."""

from __future__ import annotations

from raggedvit.pruning.backbone import Backbone, PackedState
from raggedvit.pruning.factory import PolicyStateError, build_pruned_vit, policy_state
from raggedvit.pruning.families import backbone_for, check_supported
from raggedvit.pruning.packed import (
    PrunedOutput,
    PrunedViT,
    StageTrace,
    capacity_prune_stage,
    packed_prune_stage,
    uniform_prune_stage,
)
from raggedvit.pruning.packed_block import packed_block_forward
from raggedvit.pruning.select import Selection, pad_scores, select_tokens
from raggedvit.pruning.spec import POLICIES, PruneSpec

__all__ = [
    "POLICIES",
    "Backbone",
    "backbone_for",
    "check_supported",
    "PackedState",
    "PolicyStateError",
    "PruneSpec",
    "PrunedOutput",
    "PrunedViT",
    "Selection",
    "StageTrace",
    "build_pruned_vit",
    "capacity_prune_stage",
    "packed_block_forward",
    "packed_prune_stage",
    "policy_state",
    "pad_scores",
    "select_tokens",
    "uniform_prune_stage",
]
