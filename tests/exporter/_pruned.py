"""One comparison of an exported graph's outputs with the torch packed model (PrunedViT)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from raggedvit.pruning import PrunedViT, PruneSpec


def diff_to_pruned(
    logits: np.ndarray, counts: np.ndarray, vit: nn.Module, spec: PruneSpec, images: torch.Tensor
) -> tuple[float, float]:
    """ONNX outputs (logits [B, classes], token_counts [B, stages]) vs PrunedViT(vit, spec)(images [B, 3, S, S]).

    Asserts float32 logits and int64 token_counts equal to the reference's; returns (max |Δlogit|, max |reference
    logit|) for the caller's tolerance."""
    with torch.no_grad():
        ref = PrunedViT(vit, spec)(images)
    assert logits.dtype == np.float32
    assert counts.dtype == np.int64 and counts.shape == (images.shape[0], len(spec.prune_at))
    np.testing.assert_array_equal(counts, ref.token_counts.numpy())
    return float(np.abs(logits - ref.logits.numpy()).max()), float(ref.logits.abs().max())
