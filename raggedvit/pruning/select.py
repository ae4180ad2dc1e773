"""Token selection on the padded score layout, shared by the packed forward and the padded reference.

This is the one implementation of DESIGN.md section 4 steps 3-4; the ONNX exporter mirrors it op by op
(TopK-style stable descending sort, CumSum, ScatterElements, comparisons).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from raggedvit.pruning.spec import PruneSpec, f32

__all__ = ["CLS_MASS_EPS", "Selection", "pad_scores", "select_tokens"]

CLS_MASS_EPS = 1e-30  # floor of a row's patch-score sum before normalising (cls-mass)


class Selection(NamedTuple):
    """keep [B, W] bool: which padded slots survive (prefix slots always, padding never).
    rank [B, W] int64: position of each slot in the stable descending order of the scores.
    k [B] int64: number of patch tokens kept per image."""

    keep: torch.Tensor
    rank: torch.Tensor
    k: torch.Tensor


def pad_scores(scores: torch.Tensor, seq_id: torch.Tensor, pos: torch.Tensor, batch: int, width: int, num_prefix: int):
    """Scatter packed scores [T] into the padded layout S [B, width] float32 (-inf at prefix and padding)."""
    s = torch.where(pos >= num_prefix, scores.to(torch.float32), float("-inf"))
    S = torch.full((batch, width), float("-inf"), dtype=torch.float32, device=scores.device)
    return S.index_put((seq_id, pos), s)


def select_tokens(S: torch.Tensor, n: torch.Tensor, num_prefix: int, spec: PruneSpec) -> Selection:
    """Choose the tokens one stage keeps.

    Args:
        S: [B, W] float32 padded scores, -inf at prefix slots (pos < p) and padding (pos >= n_b).
        n: [B] int64 tokens per image (prefix included), n_b <= W.
        num_prefix: p, prefix tokens per image (never pruned).
        spec: the policy and its keep / mass.

    Returns:
        Selection(keep [B, W] bool, rank [B, W] int64, k [B] int64).
    """
    B, W = S.shape
    idx = torch.arange(W, device=S.device, dtype=torch.int64)
    patches = n.to(torch.int64) - num_prefix  # P_b
    order_vals, order = torch.sort(S, dim=1, descending=True, stable=True)  # ties: lower position first
    rank = torch.zeros_like(order).scatter(1, order, idx.unsqueeze(0).expand(B, W))
    if spec.policy in ("topk-l2", "evit"):
        k = torch.ceil(patches.to(torch.float32) * f32(spec.keep)).to(torch.int64)
    elif spec.policy == "cls-mass":
        valid = idx.unsqueeze(0) < patches.unsqueeze(1)  # sorted slots j < P_b hold the patch scores
        a = torch.where(valid, order_vals, 0.0)
        a = a / a.sum(dim=1, keepdim=True).clamp_min(CLS_MASS_EPS)
        exclusive = torch.cumsum(a, dim=1) - a
        k = (valid & (exclusive < f32(spec.mass))).sum(dim=1)
    else:
        raise ValueError(f"policy {spec.policy!r} has no selection stage")
    k = torch.minimum(k.clamp_min(1), patches)
    in_image = idx.unsqueeze(0) < n.unsqueeze(1)
    keep = in_image & ((idx.unsqueeze(0) < num_prefix) | (rank < k.unsqueeze(1)))
    return Selection(keep, rank, k)
