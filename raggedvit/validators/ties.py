"""Near-ties at pruning cuts, recomputed from the PyTorch reference's own scores, and which moved cuts they explain.

Reads the stage decisions of `raggedvit.pruning.PrunedViT`'s forward (its StageTrace per stage) and, at every
stage, measures how far each image is from a different cut, relative to the scale of what is compared (scores
differ in scale: squared L2 norms ~100, cls attention ~1/N): the gap between its last kept and first dropped sorted
score relative to the last kept score, and for cls-mass the distance of the exclusive cumulative mass to `mass` at
the cut relative to `mass`. Relative margins compare directly with a dtype's relative rounding (DESIGN.md
section 6).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from raggedvit.pruning import PrunedOutput, PruneSpec, build_pruned_vit
from raggedvit.pruning.spec import CLS_MASS_EPS
from raggedvit.validators.report import NearTie, TokenSwap

__all__ = [
    "cut_gaps",
    "find_near_ties",
    "first_moved_stage",
    "precision_swap",
    "precision_tie",
    "size_swaps",
    "stage_margins",
    "token_swaps",
]


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
    if spec.descriptor.scorer == "l2":
        vals = vals.clamp_min(0).sqrt()
    P = n - num_prefix
    score_gap = torch.full((B,), float("inf"), dtype=torch.float64)
    mass_gap = torch.full((B,), float("inf"), dtype=torch.float64)
    for b in range(B):
        kb, pb = int(k[b]), int(P[b])
        if kb < pb:
            last = vals[b, kb - 1]
            score_gap[b] = (last - vals[b, kb]) / max(abs(float(last)), 1e-30)
    if spec.descriptor.cut == "mass":
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
    if not spec.descriptor.prunes:
        return []
    model = build_pruned_vit(vit, spec)
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
    if eps is None or spec.descriptor.cut != "mass" or abs(moved_by) != 1:
        return None
    at = [t for t in margins if t.stage == stage and t.kind == "mass" and t.gap < eps]
    return min(at, key=lambda t: t.gap, default=None)


def precision_swap(swap: TokenSwap, eps: float | None) -> NearTie | None:
    """The reference margin that makes an image's first deviation, a same-count token swap, a precision tie, or
    None (a fault).

    The export names the tokens each cut kept (recipe "stage_outputs", or diagnostic outputs). At the first stage
    where it kept other tokens than the reference at the same count, its input rows are the reference's, so
    rounding explains the difference only if exactly one token changed places and the reference's scores of the
    two tokens lie within `eps` of each other (relative): the same test as a cls-mass count moved by one
    (`precision_tie`), for the score order every policy cuts. Past that stage nothing is compared (the rows
    differ). `eps`: Thresholds.precision_eps (None: the recipe has no precision ties, fp32)."""
    if eps is None or swap.swapped != 1 or not swap.gap < eps:
        return None
    return NearTie(swap.image, swap.stage, swap.block, "swap", swap.gap)


def token_swaps(
    kept_onnx: list[np.ndarray], kept_reference: list[np.ndarray], out: PrunedOutput, spec: PruneSpec, image: int
) -> list[TokenSwap]:
    """The stages where the export kept as many tokens of `image` as the reference but other ones, with the
    reference's relative score gap between the swapped tokens (`_swap_gap`). kept_*: per stage the image's sorted
    kept token indices; `out`: the reference's PrunedViT forward over the images (compact layout)."""
    swaps = []
    for stage, (a, b) in enumerate(zip(kept_onnx, kept_reference)):
        if len(a) == len(b) and not np.array_equal(a, b):
            removed, added = np.setdiff1d(b, a), np.setdiff1d(a, b)
            gap = _swap_gap(out, spec, image, stage, removed, added)
            swaps.append(TokenSwap(image, stage, spec.prune_at[stage], len(added), gap))
    return swaps


def _swap_gap(
    out: PrunedOutput, spec: PruneSpec, image: int, stage: int, removed: np.ndarray, added: np.ndarray
) -> float:
    """(s(r) - s(a)) / |s(r)| with s the reference's score at `stage` (L2 norms for topk-l2, as cut_gaps), r the
    highest-scored token the export dropped of those the reference kept (`removed`), a the lowest-scored one it
    kept instead (`added`); inf where a token is not a scored row of the reference at that stage."""
    trace = out.stages[stage]
    if stage == 0:
        n = int(trace.n[image])
        tokens = np.arange(n)
    else:
        cu = out.cu_seqlens[stage - 1]
        tokens = out.token_index[stage - 1][int(cu[image]) : int(cu[image + 1])].numpy()
    scores = trace.scores[image, : len(tokens)].double()
    if spec.descriptor.scorer == "l2":
        scores = scores.clamp_min(0).sqrt()
    by_token = {int(t): float(v) for t, v in zip(tokens, scores)}
    s_removed = [by_token.get(int(t), -math.inf) for t in removed]
    s_added = [by_token.get(int(t), -math.inf) for t in added]
    if not s_removed or not s_added:
        return math.inf
    hi, lo = max(s_removed), min(s_added)
    if not (math.isfinite(hi) and math.isfinite(lo)):
        return math.inf
    return abs(hi - lo) / max(abs(hi), 1e-30)


def size_swaps(
    kept_onnx: list[np.ndarray],
    kept_reference: list[np.ndarray],
    sizes_onnx: list[np.ndarray],
    sizes_reference: list[np.ndarray],
    spec: PruneSpec,
    image: int,
) -> list[TokenSwap]:
    """tome: the stages where the export kept the same tokens of `image` as the reference (the merged rows, named
    by their destination tokens) but some of them hold other sizes: other tokens merged into them. kept_*: per stage
    the image's sorted token indices; sizes_*: per stage the sizes in that order. Reported as TokenSwap with
    swapped 0 and `resized` the rows whose size differs (never a precision tie: gap inf)."""
    swaps = []
    for stage, (a, b, sa, sb) in enumerate(zip(kept_onnx, kept_reference, sizes_onnx, sizes_reference)):
        if np.array_equal(a, b) and not np.array_equal(sa, sb):
            swaps.append(TokenSwap(image, stage, spec.prune_at[stage], 0, math.inf, int(np.count_nonzero(sa != sb))))
    return swaps
