"""Near-ties at pruning cuts, recomputed from the PyTorch reference's own scores, and which moved cuts they explain.

Reads the stage decisions of `raggedvit.pruning.PrunedViT`'s forward (its StageTrace per stage) and, at every
stage, measures how far each image is from a different cut, relative to the scale of what is compared (scores
differ in scale: squared L2 norms ~100, cls attention ~1/N): the gap between its last kept and first dropped sorted
score relative to the last kept score, and for cls-mass the distance of the exclusive cumulative mass to `mass` at
the cut relative to `mass`. Relative margins compare directly with a dtype's relative rounding (DESIGN.md
section 6).
"""

from __future__ import annotations

import torch

from raggedvit.pruning import PrunedOutput, PrunedViT, PruneSpec
from raggedvit.pruning.spec import CLS_MASS_EPS
from raggedvit.validators.report import NearTie, TokenSwap

__all__ = ["cut_gaps", "find_near_ties", "first_moved_stage", "precision_swap", "precision_tie", "stage_margins"]


def cut_gaps(S: torch.Tensor, n: torch.Tensor, k: torch.Tensor, num_prefix: int, spec: PruneSpec):
    """Distances to a different cut, per image.

    Args:
        S: [B, W] float32 padded scores (-inf off patches); n: [B] tokens per image; k: [B] patch tokens kept.

    Returns:
        (score_gap [B] = (s_last_kept - s_first_dropped) / |s_last_kept|, mass_gap [B] = min |exclusive mass - mass|
        / mass at the cut) float64, +inf where no cut exists (all patches kept) / not cls-mass. topk-l2 gaps are of
        the L2 norms (PrunedViT ranks their squares, the same order; the square would double every relative gap).
    """
    B, W = S.shape
    vals = torch.sort(S, dim=1, descending=True, stable=True).values.double()
    if spec.policy == "topk-l2":
        vals = vals.clamp_min(0).sqrt()
    P = n - num_prefix
    score_gap = torch.full((B,), float("inf"), dtype=torch.float64)
    mass_gap = torch.full((B,), float("inf"), dtype=torch.float64)
    for b in range(B):
        kb, pb = int(k[b]), int(P[b])
        if kb < pb:
            last = vals[b, kb - 1]
            score_gap[b] = (last - vals[b, kb]) / max(abs(float(last)), 1e-30)
    if spec.policy == "cls-mass":
        idx = torch.arange(W)
        valid = idx.unsqueeze(0) < P.unsqueeze(1)
        a = torch.where(valid, vals.float(), 0.0)
        a = a / a.sum(dim=1, keepdim=True).clamp_min(CLS_MASS_EPS)
        excl = (torch.cumsum(a, dim=1) - a).double()
        for b in range(B):
            kb, pb = int(k[b]), int(P[b])
            cands = [abs(float(excl[b, j]) - spec.mass) / spec.mass for j in (kb - 1, kb) if 0 < j < pb]
            if cands:
                mass_gap[b] = min(cands)
    return score_gap, mass_gap


@torch.no_grad()
def find_near_ties(vit: torch.nn.Module, spec: PruneSpec, images: torch.Tensor, eps: float) -> list[NearTie]:
    """Near-ties (< eps) of every image at every stage; images [B, 3, S, S] float32 on CPU.

    The scores, counts and cuts are the ones PrunedViT's own forward decided on (PrunedOutput.stages)."""
    if spec.policy == "none":
        return []
    model = PrunedViT(vit, spec)
    return stage_margins(model(images), spec, model.num_prefix, eps)


def stage_margins(out: PrunedOutput, spec: PruneSpec, num_prefix: int, eps: float) -> list[NearTie]:
    """Near-ties (< eps; eps = inf: every cut's margin) of a PrunedViT forward's stages (PrunedOutput.stages)."""
    ties = []
    for stage, (block, trace) in enumerate(zip(spec.prune_at, out.stages)):
        score_gap, mass_gap = cut_gaps(trace.scores, trace.n, trace.k, num_prefix, spec)
        for b in range(out.logits.shape[0]):
            if score_gap[b] < eps:
                ties.append(NearTie(b, stage, block, "score", float(score_gap[b])))
            if mass_gap[b] < eps:
                ties.append(NearTie(b, stage, block, "mass", float(mass_gap[b])))
    return ties


def first_moved_stage(counts_onnx: list[int], counts_reference: list[int]) -> int | None:
    """The first stage whose token count differs from the reference's (None: all agree)."""
    return next((s for s, (a, b) in enumerate(zip(counts_onnx, counts_reference)) if a != b), None)


def precision_tie(
    margins: list[NearTie], stage: int, moved_by: int, spec: PruneSpec, eps: float | None
) -> NearTie | None:
    """The reference margin that makes a cut moved by `moved_by` tokens at `stage` a precision tie, or None (the
    moved cut is a fault).

    Only a cls-mass count can move by rounding: its cut follows the cumulative mass, and it moves by one token when
    the export's mass at the cut crosses `mass` where the reference's lies within `eps` (relative) of it. Moving by
    two or more tokens also needs the noise to exceed the mass of the whole token in between; the margins here are
    to the two neighbouring cuts only, so such a move is failed (conservative). topk-l2 and evit keep
    ceil(P x keep) tokens whatever the scores: a moved count there is never precision. `margins`: the image's
    NearTies at every cut (find_near_ties with eps = inf); `eps`: Thresholds.precision_eps (None: no precision ties).
    """
    if eps is None or spec.policy != "cls-mass" or abs(moved_by) != 1:
        return None
    at = [t for t in margins if t.stage == stage and t.kind == "mass" and t.gap < eps]
    return min(at, key=lambda t: t.gap, default=None)


def precision_swap(swaps: list[TokenSwap], eps: float | None) -> NearTie | None:
    """The reference margin that makes the export's same-count token swaps a precision tie, or None (a fault).

    Exports with diagnostic outputs name the tokens each cut kept. When the counts agree but the export kept other
    tokens, rounding explains it only if at every stage with a swap exactly one token changed places and the
    reference's score gap there (last kept against first dropped) lies within `eps`: the same test as a cls-mass
    count moved by one (`precision_tie`), for the score order every policy cuts. `eps`: Thresholds.precision_eps
    (None: the recipe has no precision ties, fp32)."""
    if eps is None or not swaps or any(s.swapped != 1 or not s.gap < eps for s in swaps):
        return None
    first = swaps[0]
    return NearTie(first.image, first.stage, first.block, "swap", first.gap)
