"""Token selection of one pruning stage (DESIGN.md section 4 steps 2-4): the one implementation.

`select_tokens` is the general selection on the padded score layout (any per-image counts, every policy);
`uniform_topk` is the same decision when every image has the same export-time-known count and the policy's k
depends on that count only (topk-l2, evit without fuse): static shapes, so a traced graph needs no NonZero.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from raggedvit.policies import COUNT_POLICIES
from raggedvit.pruning.spec import CLS_MASS_EPS, PruneSpec, f32, uniform_keep

__all__ = ["Selection", "pad_rows", "pad_scores", "padded_slots", "select_tokens", "uniform_topk"]


class Selection(NamedTuple):
    """keep [B, W] bool: which padded slots survive (prefix slots always, padding never).
    rank [B, W] int64: position of each slot in the stable descending order of the scores.
    k [B] int64: number of patch tokens kept per image."""

    keep: torch.Tensor
    rank: torch.Tensor
    k: torch.Tensor


def padded_slots(cu: torch.Tensor, n: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The padded layout of packed rows: (rows [B, width] int64: the packed row of slot j of image b, cu[b] + j,
    0 for padding; valid [B, width] bool: j < n_b). cu [B+1], n [B] = cu[1:] - cu[:-1]."""
    slot = torch.arange(width, device=cu.device, dtype=torch.int64).unsqueeze(0)  # [1, W]
    valid = slot < n.unsqueeze(1)
    return torch.where(valid, cu[:-1].unsqueeze(1) + slot, 0), valid


def pad_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Packed rows x [T, C] -> padded [B, W, C] by `padded_slots` rows (padding slots repeat row 0: mask them).

    Per-image reductions read this layout (a gather, no scatter-add: ONNX Runtime's CPU ScatterND with an add
    reduction races on repeated indices)."""
    B, W = rows.shape
    return x.index_select(0, rows.reshape(-1)).reshape(B, W, x.shape[1])


def pad_scores(scores: torch.Tensor, cu: torch.Tensor, n: torch.Tensor, width: int, num_prefix: int) -> torch.Tensor:
    """Packed scores [T] -> padded S [B, width] float32: slot j of image b holds row cu[b] + j; -inf at prefix
    slots (j < p) and padding (j >= n_b). cu [B+1], n [B] = cu[1:] - cu[:-1]. A gather (no scatter)."""
    rows, valid = padded_slots(cu, n, width)
    slot = torch.arange(width, device=scores.device, dtype=torch.int64).unsqueeze(0)
    s = torch.take(scores.to(torch.float32), rows)
    return torch.where(valid & (slot >= num_prefix), s, float("-inf"))


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
    rank = order.scatter(1, order, idx.expand_as(order))  # inverse permutation (every slot is written)
    if spec.policy in COUNT_POLICIES:
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


def uniform_topk(scores: torch.Tensor, n: int, num_prefix: int, keep: float) -> torch.Tensor:
    """Kept slots of a uniform state: scores [B*n] (n rows per image) -> slots [B, p + k] int64 ascending.

    The prefix slots 0..p-1, then the k = uniform_keep(n, p, keep) best patch slots in ascending position;
    among equal scores the lower position wins. Same rows as `select_tokens` on this state (tested)."""
    p = num_prefix
    k = uniform_keep(n, p, keep)
    S = scores.to(torch.float32).reshape(-1, n)[:, p:]  # [B, n - p]
    best = torch.sort(S, dim=1, descending=True, stable=True).indices[:, :k]  # [B, k]
    patches = torch.sort(best, dim=1).values + p  # ascending positions
    if p == 0:
        return patches
    prefix = torch.arange(p, device=scores.device, dtype=torch.int64).expand(patches.shape[0], p)
    return torch.cat((prefix, patches), dim=1)
