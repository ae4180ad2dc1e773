"""`torch.ops.raggedvit.select_rows`: the index computation of a capacity / uniform pruning stage as one op.

Schema: (scores [T] float32, cu [B+1] int64, width W, bound, num_prefix p, policy 0 count / 1 mass, keep, mass)
        -> (src [B*bound], cu_new [B+1], seq_id [B*bound], pos [B*bound], k [B]), all int64 (`SelectedRows`).
CPU: `select.select_rows_reference`, today's stage math (the one definition). CUDA: the Triton kernels of
`raggedvit/kernels/_select_kernel.py` (two launches, no host read; the same rows, except that the cls-mass sums
run in another float order, see DESIGN.md section 4). The fake implementation reads shapes only. The exporter
maps the op to `com.raggedvit::RaggedSelect` (exporter/translations.py), so a stage exports as that node plus
the gathers of its rows.
"""

from __future__ import annotations

import torch

from raggedvit.pruning.select import SELECT_POLICIES, SelectedRows, select_policy, select_rows_reference
from raggedvit.pruning.spec import PruneSpec

__all__ = ["select_rows", "select_rows_op"]


def _check(scores: torch.Tensor, cu: torch.Tensor, width: int, bound: int, num_prefix: int, policy: int) -> None:
    """Validate shapes, dtypes, devices and the static arguments (never reads tensor data)."""
    if scores.dim() != 1 or scores.dtype != torch.float32:
        raise ValueError(f"scores must be 1-D [T] float32, got shape {tuple(scores.shape)} {scores.dtype}")
    if cu.dim() != 1 or cu.shape[0] < 2 or cu.dtype != torch.int64:
        raise ValueError(f"cu must be 1-D [B+1] int64 with B >= 1, got shape {tuple(cu.shape)} {cu.dtype}")
    if cu.device != scores.device:
        raise ValueError(f"cu is on {cu.device} but scores is on {scores.device}")
    if width < 1 or not 0 <= bound <= width or num_prefix < 0:
        raise ValueError(f"need width >= 1, 0 <= bound <= width, num_prefix >= 0; got {width}, {bound}, {num_prefix}")
    if policy not in SELECT_POLICIES.values():
        raise ValueError(f"policy must be one of {SELECT_POLICIES} (codes), got {policy!r}")


@torch.library.custom_op("raggedvit::select_rows", mutates_args=())
def select_rows_op(
    scores: torch.Tensor,
    cu: torch.Tensor,
    width: int,
    bound: int,
    num_prefix: int,
    policy: int,
    keep: float,
    mass: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    raise NotImplementedError(f"raggedvit::select_rows has no kernel for device {scores.device}")


@select_rows_op.register_kernel("cpu")
def _cpu_kernel(scores, cu, width, bound, num_prefix, policy, keep, mass):
    return tuple(select_rows_reference(scores, cu, width, bound, num_prefix, policy, keep, mass))


@select_rows_op.register_kernel("cuda")
def _cuda_kernel(scores, cu, width, bound, num_prefix, policy, keep, mass):
    from raggedvit.kernels._select_launch import launch_select

    with torch.cuda.device(scores.device):
        return launch_select(scores.contiguous(), cu.contiguous(), width, bound, num_prefix, policy, keep, mass)


@select_rows_op.register_fake
def _fake(scores, cu, width, bound, num_prefix, policy, keep, mass):
    B = cu.shape[0] - 1
    rows = scores.new_empty((B * bound,), dtype=torch.int64)
    return rows, cu.new_empty(cu.shape), rows.new_empty(rows.shape), rows.new_empty(rows.shape), cu.new_empty((B,))


def select_rows(
    scores: torch.Tensor,
    cu: torch.Tensor,
    width: int,
    bound: int,
    num_prefix: int,
    spec: PruneSpec,
    *,
    keep: float | None = None,
) -> SelectedRows:
    """Which rows a stage without evit's fuse keeps, in the capacity layout (DESIGN.md section 4).

    Args:
        scores: [T] float32 score of each packed row (prefix rows ignored).
        cu: [B+1] int64 on scores' device (B >= 1); n_b = cu[b+1] - cu[b] <= width; rows past cu[B] never read.
        width: static bound of the rows per image before the stage.
        bound: output rows per image (<= width; >= p + k_b: the width, or p + k when the counts are known).
        num_prefix: p.
        spec: topk-l2 / evit (k = ceil(P_b * keep)), dynamicvit (a count: `keep` given) or cls-mass; spec.fuse is
            not supported here.
        keep: the count rule's fraction instead of spec.keep (a stage whose count comes from elsewhere, as a
            fraction that gives it exactly: raggedvit.pruning.spec.count_as_keep).

    Returns:
        SelectedRows: src, cu, seq_id, pos [B*bound] / [B+1] int64 and k [B] int64.
    """
    if spec.fuse:
        raise ValueError("select_rows does not fuse dropped tokens (evit with fuse keeps the torch stage)")
    policy = select_policy(spec.policy)
    width, bound, num_prefix = int(width), int(bound), int(num_prefix)
    _check(scores, cu, width, bound, num_prefix, policy)
    keep = spec.keep if keep is None else keep
    out = select_rows_op(scores, cu, width, bound, num_prefix, policy, float(keep), float(spec.mass))
    return SelectedRows(*out)
