"""Token selection of one pruning stage (DESIGN.md section 4 steps 2-4): the one implementation.

`select_tokens` is the general selection on the padded score layout (any per-image counts, every policy; uniform
states of the count policies go through the same op with an exact capacity, so their graphs need no NonZero).
`capacity_order` compacts a decision into the capacity layout; `select_rows_reference` is the whole index
computation of a capacity stage (the CPU implementation of `torch.ops.raggedvit.select_rows`, `select_op.py`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from raggedvit.policies import get_policy
from raggedvit.pruning.spec import CLS_MASS_EPS, PruneSpec, f32

__all__ = [
    "SELECT_POLICIES",
    "SelectedRows",
    "Selection",
    "capacity_order",
    "check_fractions",
    "cu_of",
    "pad_rows",
    "pad_scores",
    "padded_slots",
    "select_policy",
    "select_rows_reference",
    "select_tokens",
]

# `policy` codes of select_rows / com.raggedvit::RaggedSelect: k from the count (topk-l2, evit) or the cls mass
SELECT_POLICIES = {"count": 0, "mass": 1}


class Selection(NamedTuple):
    """keep [B, W] bool: which padded slots survive (prefix slots always, padding never).
    rank [B, W] int64: position of each slot in the stable descending order of the scores.
    k [B] int64: number of patch tokens kept per image."""

    keep: torch.Tensor
    rank: torch.Tensor
    k: torch.Tensor


class SelectedRows(NamedTuple):
    """The index computation of one capacity stage (B images, `bound` output rows per image):
    src [B*bound] int64: the packed source row of each output row (live rows [0, cu[B]) image by image in position
    order, then the dead rows: the other slots in slot order, padding slots as row 0);
    cu [B+1] int64 of the output rows; seq_id [B*bound] int64 and pos [B*bound] int64 of each output row;
    k [B] int64: patch rows kept per image."""

    src: torch.Tensor
    cu: torch.Tensor
    seq_id: torch.Tensor
    pos: torch.Tensor
    k: torch.Tensor


def cu_of(counts: torch.Tensor) -> torch.Tensor:
    """counts [B] int64 -> cu [B+1] = [0, cumsum(counts)]."""
    return torch.cat((torch.zeros(1, dtype=torch.int64, device=counts.device), torch.cumsum(counts, dim=0)))


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


def select_tokens(
    S: torch.Tensor, n: torch.Tensor, num_prefix: int, spec: PruneSpec, keep: float | None = None
) -> Selection:
    """Choose the tokens one stage keeps.

    Args:
        S: [B, W] float32 padded scores, -inf at prefix slots (pos < p) and padding (pos >= n_b).
        n: [B] int64 tokens per image (prefix included), n_b <= W.
        num_prefix: p, prefix tokens per image (never pruned).
        spec: the policy and its keep / mass.
        keep: the count rule's fraction instead of spec.keep (raggedvit.pruning.spec.count_as_keep).

    Returns:
        Selection(keep [B, W] bool, rank [B, W] int64, k [B] int64).
    """
    return _select(S, n, num_prefix, select_policy(spec.policy), spec.keep if keep is None else keep, spec.mass)


def select_policy(policy: str) -> int:
    """The SELECT_POLICIES code of a pruning policy: "count" for topk-l2 / evit and dynamicvit's schedule (a count
    per stage), "mass" for cls-mass."""
    cut = get_policy(policy).cut
    if cut in ("count", "mass", "schedule"):
        return SELECT_POLICIES["mass" if cut == "mass" else "count"]
    raise ValueError(f"policy {policy!r} has no selection stage")


def check_fractions(policy: int, keep: float, mass: float) -> None:
    """ValueError unless the policy's own fraction (keep for count, mass for mass) is in (0, 1] and the other one is
    0 (unset) or in (0, 1]: RaggedSelect's attribute rule (a keep above 1 would overflow ceil(P_b * keep))."""
    own = "keep" if policy == SELECT_POLICIES["count"] else "mass"
    for name, value in (("keep", keep), ("mass", mass)):
        lo_ok = value > 0.0 if name == own else value >= 0.0
        if not (math.isfinite(value) and lo_ok and value <= 1.0):
            want = "(0, 1]" if name == own else "[0, 1]"
            raise ValueError(f"{name} must be in {want} (policy {policy}), got {value}")


def _select(S: torch.Tensor, n: torch.Tensor, num_prefix: int, policy: int, keep: float, mass: float) -> Selection:
    """select_tokens by policy code (SELECT_POLICIES): k = ceil(P_b * keep) (count) or the cls-mass count."""
    B, W = S.shape
    idx = torch.arange(W, device=S.device, dtype=torch.int64)
    patches = n.to(torch.int64) - num_prefix  # P_b
    order_vals, order = torch.sort(S, dim=1, descending=True, stable=True)  # ties: lower position first
    rank = order.scatter(1, order, idx.expand_as(order))  # inverse permutation (every slot is written)
    if policy == SELECT_POLICIES["count"]:
        k = torch.ceil(patches.to(torch.float32) * f32(keep)).to(torch.int64)
    else:
        valid = idx.unsqueeze(0) < patches.unsqueeze(1)  # sorted slots j < P_b hold the patch scores
        a = torch.where(valid, order_vals, 0.0)
        a = a / a.sum(dim=1, keepdim=True).clamp_min(CLS_MASS_EPS)
        exclusive = torch.cumsum(a, dim=1) - a
        k = (valid & (exclusive < f32(mass))).sum(dim=1)
    k = torch.minimum(k.clamp_min(1), patches)
    in_image = idx.unsqueeze(0) < n.unsqueeze(1)
    keep = in_image & ((idx.unsqueeze(0) < num_prefix) | (rank < k.unsqueeze(1)))
    return Selection(keep, rank, k)


def capacity_order(keep: torch.Tensor, cu_new: torch.Tensor, bound: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Capacity compaction (DESIGN.md section 4) of keep [B, W'] bool with cu_new [B+1] = cu_of(keep.sum(1)):
    (order [B*bound] int64: the slot b*W' + j each output row copies, pos [B*bound] int64: its position among the
    kept slots of its image, 0 before the first).

    keep flattened row-major; kept_before = exclusive cumsum; a kept slot goes to row kept_before, any other slot
    to cu_new[B] + (its index - kept_before): a permutation of the slots, inverted by a scatter of distinct indices
    (no reduction), of which the first B*bound rows are taken."""
    B = cu_new.shape[0] - 1
    flat = keep.reshape(-1).to(torch.int64)  # [B*W'] row-major
    slot = torch.arange(flat.shape[0], device=flat.device)
    kept_before = torch.cumsum(flat, dim=0) - flat  # exclusive
    dest = torch.where(flat > 0, kept_before, cu_new[B] + slot - kept_before)  # a permutation of the slots
    order = torch.zeros_like(slot).scatter(0, dest, slot)[: B * bound]  # [B*bound] the slot each row copies
    pos = (torch.cumsum(keep.to(torch.int64), dim=1) - 1).clamp_min(0).reshape(-1).index_select(0, order)
    return order, pos


def select_rows_reference(
    scores: torch.Tensor,
    cu: torch.Tensor,
    width: int,
    bound: int,
    num_prefix: int,
    policy: int,
    keep: float,
    mass: float,
) -> SelectedRows:
    """The index computation of a capacity stage without evit's fuse (steps 2-5 of DESIGN.md section 4 and its
    capacity compaction): pad_scores, select_tokens' decision, capacity_order.

    Args:
        scores: [T] float32 score of each packed row (prefix rows ignored).
        cu: [B+1] int64; rows [cu[b], cu[b+1]) are image b (n_b <= width), rows past cu[B] are never read.
        width: W, static bound of the rows per image before the stage.
        bound: rows per image the output holds (<= width, >= every image's kept count).
        num_prefix: p, prefix rows per image (always kept).
        policy: SELECT_POLICIES code; keep (count) or mass (mass) as select_tokens.

    Returns:
        SelectedRows (src, cu, seq_id, pos of B*bound output rows; k [B]).
    """
    check_fractions(policy, keep, mass)
    n = cu[1:] - cu[:-1]
    S = pad_scores(scores, cu, n, width, num_prefix)
    sel = _select(S, n, num_prefix, policy, keep, mass)
    rows, _ = padded_slots(cu, n, width)  # [B, W] source row of each slot (padding: row 0)
    cu_new = cu_of(sel.keep.sum(dim=1))
    order, pos = capacity_order(sel.keep, cu_new, bound)
    return SelectedRows(rows.reshape(-1).index_select(0, order), cu_new, order // width, pos, sel.k)
