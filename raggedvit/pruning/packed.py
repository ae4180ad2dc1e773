"""The pruned ViT on packed tokens: every block runs on [T, C] rows with the ragged attention op.

This module is the one definition of a pruned forward and of its stages (DESIGN.md section 4): PyTorch runs it,
the exporter traces it, the validator reads its stage diagnostics.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch
from torch import nn

from raggedvit.pruning.backbone import AttentionFn, Backbone, PackedState
from raggedvit.pruning.families import backbone_for
from raggedvit.pruning.merge import merge_sets, merge_widths
from raggedvit.pruning.merge_op import MergeKeys, merge_tokens
from raggedvit.pruning.scorers import scorer_for
from raggedvit.pruning.select import (
    capacity_order,
    cu_of,
    pad_rows,
    pad_scores,
    padded_slots,
    select_tokens,
)
from raggedvit.pruning.select_op import select_rows
from raggedvit.pruning.spec import PruneSpec, merged_count

__all__ = [
    "RAGGED_LINEAR_MODES",
    "PackedState",
    "PrunedOutput",
    "PrunedViT",
    "StageTrace",
    "backbone_refusal",
    "capacity_prune_stage",
    "kept_token_index",
    "merge_stage",
    "next_token_index",
    "packed_prune_stage",
    "ragged_linear_mode",
    "uniform_prune_stage",
]


class StageTrace(NamedTuple):
    """What one stage decided on: scores [B, W] float32 (padded, -inf off patch slots), n [B] int64 tokens per
    image before the stage, k [B] int64 patch tokens kept, kept [B] int64 tokens per image after the stage
    (prefix and fused token included); src [T'] int64: the packed row before the stage that each row after it
    copies (with evit's fuse, row T + b stands for image b's fused token; `next_token_index`). The validator
    measures near-ties from these; the exporter names src (a live tensor: the stage's row gather reads it). A tome
    stage: scores = each A row's best similarity at its slot (-inf at prefix and B slots), k = the rows merged (the
    r best: the cut is between the k-th and the next score, as for the kept tokens of a pruning stage), src = the
    row each merged row is named after (its destination: a B row, or an unmerged row itself)."""

    scores: torch.Tensor
    n: torch.Tensor
    k: torch.Tensor
    kept: torch.Tensor
    src: torch.Tensor | None = None


class PrunedOutput(NamedTuple):
    """logits [B, classes] float32 (headless models: the pooled features [B, C]); token_counts [B, stages] int64
    (tokens per image after each stage, prefix and fused token included); per stage: token_index [T_s] int64
    (original token index of each kept packed row, -1 for an evit fused token), cu_seqlens [B+1] int64 of the
    packed rows after that stage, and the StageTrace. In the capacity layout T_s is the stage's static capacity:
    only token_index[:cu_seqlens[B]] are kept rows. blocks (PrunedViT(..., block_outputs=True) only): per block, its
    output rows [T_b, C] in the residual stream's dtype, packed like the block's input (the last block: the rows the
    head reads when it reads a fixed number per image; capacity layout: dead rows past the stage's cu[B]).
    token_size (tome only): per stage, the size of each row (original tokens merged into it, float32); a merged
    row's token_index is its destination token's."""

    logits: torch.Tensor
    token_counts: torch.Tensor
    token_index: tuple[torch.Tensor, ...] = ()
    cu_seqlens: tuple[torch.Tensor, ...] = ()
    stages: tuple[StageTrace, ...] = ()
    blocks: tuple[torch.Tensor, ...] = ()
    token_size: tuple[torch.Tensor, ...] = ()  # tome: per stage, [T_s] float32 tokens merged into each row


RAGGED_LINEAR_MODES = ("all", "dead-rows")


def ragged_linear_mode(value: bool | str | None) -> str | None:
    """PrunedViT's `ragged_linear` argument -> None (off), "all" or "dead-rows" (True means "all")."""
    if value is None or value is False:
        return None
    if value is True:
        return "all"
    if value in RAGGED_LINEAR_MODES:
        return str(value)
    raise ValueError(f"ragged_linear must be False, True or one of {', '.join(RAGGED_LINEAR_MODES)}; got {value!r}")


def next_token_index(token_index: torch.Tensor, src: torch.Tensor, batch: int, fuse: bool) -> torch.Tensor:
    """The original token index [T'] of the rows after a stage: token_index [T] of the rows before it, gathered by
    the stage's src [T'] (StageTrace.src); with `fuse`, source row T + b is image b's fused token (index -1)."""
    if fuse:
        token_index = torch.cat((token_index, torch.full((batch,), -1, dtype=token_index.dtype, device=src.device)))
    return token_index.index_select(0, src)


def kept_token_index(srcs: list[torch.Tensor], batch: int, tokens: int, fuse: bool) -> list[torch.Tensor]:
    """Per stage, the original token index of each packed row after it ([T_s] int64, PrunedOutput.token_index),
    from the stages' src alone (StageTrace.src; an export names them, recipe key "stage_outputs"): the rows
    before the first stage are the `tokens` tokens of each of `batch` images in order."""
    rows = torch.arange(batch * tokens, device=srcs[0].device if srcs else None)
    index, out = rows % tokens, []
    for src in srcs:
        index = next_token_index(index, src, batch, fuse)
        out.append(index)
    return out


def _decide(
    state: PackedState,
    scores: torch.Tensor,
    cls_attn: torch.Tensor | None,
    width: int,
    num_prefix: int,
    spec: PruneSpec,
    keep: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, StageTrace]:
    """Steps 2-4 and 6 of a stage on the padded layout: (keep [B, W'] bool, source rows x [T (+B), C],
    StageTrace without src). W' = width, or width + 1 with evit's fuse: slot `width` of image b is its fused token,
    appended to the sources as row T + b."""
    x, cu, _, _, _ = state
    B = cu.shape[0] - 1
    n = cu[1:] - cu[:-1]
    S = pad_scores(scores, cu, n, width, num_prefix)
    sel = select_tokens(S, n, num_prefix, spec, keep)
    keep = sel.keep  # [B, W]
    x_src = x
    if spec.fuse:
        assert cls_attn is not None
        rows, valid = padded_slots(cu, n, width)
        idx = torch.arange(width, device=x.device)
        dropped = (~keep) & valid & (idx >= num_prefix)  # [B, W]
        w = torch.where(dropped, torch.take(cls_attn.to(torch.float32), rows), 0.0)  # [B, W]
        # EViT's fused token: the sum of the dropped rows weighted by their class attention, not renormalised
        fused = torch.bmm(w.unsqueeze(1), pad_rows(x, rows).float()).squeeze(1).to(x.dtype)  # [B, C]
        keep = torch.cat((keep, torch.ones(B, 1, dtype=torch.bool, device=x.device)), dim=1)  # slot W = fused
        x_src = torch.cat((x, fused), dim=0)
    return keep, x_src, StageTrace(S, n, sel.k, keep.sum(dim=1))


def packed_prune_stage(
    state: PackedState,
    scores: torch.Tensor,
    cls_attn: torch.Tensor | None,
    width: int,
    num_prefix: int,
    spec: PruneSpec,
    keep: float | None = None,
) -> tuple[PackedState, StageTrace]:
    """One prune stage (DESIGN.md section 4) on packed rows, any per-image counts (data-dependent: nonzero).

    Args:
        state: packed rows after the previous block (rows past cu[B], if any, are never read).
        scores: [T] float32 score of each row (ignored for prefix rows).
        cls_attn: [T] float32 cls attention of the previous block (needed for evit fuse), else None.
        width: static Nmax >= every image's token count.
        num_prefix: p.
        spec: the policy.
        keep: the count rule's fraction instead of spec.keep (a count from another rule: spec.count_as_keep).

    Returns:
        (new state with T' = the kept rows, the stage's StageTrace).
    """
    B = state.cu.shape[0] - 1
    T = state.x.shape[0]
    keep, x_src, trace = _decide(state, scores, cls_attn, width, num_prefix, spec, keep)
    nz = torch.nonzero(keep).t()  # [2, T'] row-major: image by image, position order kept (ONNX NonZero's layout)
    b, i = nz[0], nz[1]
    t_new = nz.shape[1]
    torch._check(t_new >= B)
    torch._check(t_new <= B * keep.shape[1])
    src = state.cu.index_select(0, b) + i
    if spec.fuse:
        src = torch.where(i == width, T + b, src)
    pos_new = (torch.cumsum(keep.to(torch.int64), dim=1) - 1)[b, i]
    index = next_token_index(state.token_index, src, B, spec.fuse)
    new = PackedState(x_src.index_select(0, src), cu_of(trace.kept), b, pos_new, index)
    return new, StageTrace(trace.scores, trace.n, trace.k, trace.kept, src)  # (dynamo 2.11: no _replace)


def capacity_prune_stage(
    state: PackedState,
    scores: torch.Tensor,
    cls_attn: torch.Tensor | None,
    width: int,
    bound: int,
    num_prefix: int,
    spec: PruneSpec,
    keep: float | None = None,
) -> tuple[PackedState, StageTrace]:
    """The same stage as `packed_prune_stage` into a static capacity of B * bound rows (DESIGN.md section 4,
    "Capacity layout"): no nonzero, no host read, every shape known from B, width and bound.

    Rows [0, cu'[B]) are the kept rows in packed_prune_stage's order (image by image, position order, the fused
    token last); rows [cu'[B], B * bound) are dead: copies of the stage's other slots in slot order (each image's
    dropped rows, and row 0 for padding slots past its count), with their seq_id, pos and token_index: finite and
    in range, never read as tokens. Each slot's destination comes from cumsums of keep (kept slots first, then the
    rest), its inverse permutation from a scatter of distinct indices (no reduction), the rows from one gather.

    Args:
        state: packed rows; only rows [0, cu[B]) are read (the padded layout of `width` slots per image).
        scores, cls_attn, num_prefix, spec, keep: as packed_prune_stage.
        width: static bound of every image's row count before the stage.
        bound: static bound of every image's row count after it (width + fuse, or p + k + fuse when the counts are
            known before the data); the new state has B * bound rows.
    """
    if not spec.fuse:
        return _selected_stage(state, scores, width, bound, num_prefix, spec, keep)
    B = state.cu.shape[0] - 1
    T = state.x.shape[0]
    keep, x_src, trace = _decide(state, scores, cls_attn, width, num_prefix, spec, keep)
    slots = keep.shape[1]
    assert bound <= slots, f"capacity bound {bound} exceeds the {slots} slots per image"
    rows, _ = padded_slots(state.cu, trace.n, width)  # [B, W] source row of each slot (padding: row 0)
    rows = torch.cat((rows, T + torch.arange(B, device=rows.device).unsqueeze(1)), dim=1)  # [B, W'] fused last
    cu_new = cu_of(trace.kept)
    order, pos = capacity_order(keep, cu_new, bound)
    src = rows.reshape(-1).index_select(0, order)
    index = next_token_index(state.token_index, src, B, spec.fuse)
    new = PackedState(x_src.index_select(0, src), cu_new, order // slots, pos, index)
    return new, StageTrace(trace.scores, trace.n, trace.k, trace.kept, src)  # (dynamo 2.11: no _replace)


def _selected_stage(
    state: PackedState,
    scores: torch.Tensor,
    width: int,
    bound: int,
    num_prefix: int,
    spec: PruneSpec,
    keep: float | None = None,
) -> tuple[PackedState, StageTrace]:
    """capacity_prune_stage without fuse: the indices from one op (`select_rows`), then the gathers of the rows.
    The trace's padded scores and counts are torch ops that only diagnostics read (dead code in an export)."""
    assert bound <= width, f"capacity bound {bound} exceeds the {width} slots per image"
    sel = select_rows(scores, state.cu, width, bound, num_prefix, spec, keep=keep)
    new = PackedState(
        state.x.index_select(0, sel.src),
        sel.cu,
        sel.seq_id,
        sel.pos,
        next_token_index(state.token_index, sel.src, state.cu.shape[0] - 1, fuse=False),
    )
    n = state.cu[1:] - state.cu[:-1]
    S = pad_scores(scores, state.cu, n, width, num_prefix)
    # kept = min(n_b, p) + k_b = p + k_b (every image keeps its p prefix rows from the embedding on, so n_b >= p):
    # the differences of sel.cu, without the two Slices and a Sub per stage in the export (3 kernels at batch 1)
    return new, StageTrace(S, n, sel.k, sel.k + num_prefix, sel.src)


def uniform_prune_stage(
    state: PackedState, scores: torch.Tensor, n: int, num_prefix: int, k: int, spec: PruneSpec, steps: torch.Tensor
) -> tuple[PackedState, StageTrace]:
    """A stage of a uniform state (every image has n rows) whose count k is known before the data: static shapes,
    no nonzero.

    spec: a "count" or "schedule" policy without fuse. Keeps the same rows in the same order as
    `packed_prune_stage`: the k best patch rows (PruneSpec.stage_keep) and the prefix of each image in position
    order, whose indices come from one op (`select_rows` with bound = p + k: no dead rows); the new state is uniform
    again with m = p + k rows per image. steps: [B+1] int64 = 0..B (its cu is steps * m, as are the op's cu; seq_id
    / pos of uniform rows need no op either)."""
    m = num_prefix + k
    keep = spec.count_keep(k, n, num_prefix)  # a count from another rule: the fraction the op turns into k exactly
    src = select_rows(scores.to(torch.float32), state.cu, n, m, num_prefix, spec, keep=keep).src
    new = PackedState(
        state.x.index_select(0, src),
        steps * m,
        state.seq_id.reshape(-1, n)[:, :m].reshape(-1),
        state.pos.reshape(-1, n)[:, :m].reshape(-1),  # uniform rows: positions 0..m-1 in every image
        next_token_index(state.token_index, src, state.cu.shape[0] - 1, fuse=False),
    )
    slot = torch.arange(n, device=scores.device)
    S = torch.where(slot >= num_prefix, scores.to(torch.float32).reshape(-1, n), float("-inf"))
    counts = state.cu[1:] - state.cu[:-1]
    return new, StageTrace(S, counts, counts * 0 + (m - num_prefix), counts * 0 + m, src)


def merge_stage(
    state: PackedState,
    size: torch.Tensor | None,
    keys: MergeKeys,
    n: int,
    num_prefix: int,
    r: int,
    class_token: bool = True,
) -> tuple[PackedState, torch.Tensor, torch.Tensor, StageTrace]:
    """One tome stage (raggedvit/pruning/merge.py) on a uniform state of n rows per image: one op
    (merge_op.merge_tokens, com.raggedvit::RaggedMerge in an export).

    Args:
        state: packed rows, x [B*n, C] the residual stream after the block's attention.
        size: [B*n] float32 tokens in each row, or None (every row one token: before the first merge).
        keys: the block's MergeKeys (the metric: its keys averaged over heads).
        n, num_prefix, r: rows per image, prefix rows p, the spec's r (merged_count(n, p, r) rows merge).
        class_token: the model has a class token (ToMe then keeps the unmerged rows in position order).

    Returns:
        (the merged state, uniform with m = n - merged_count rows per image; its sizes [B*m] float32; the next
        blocks' key bias log(size) [B*m] float32; StageTrace).
    """
    out = merge_tokens(state.x, keys, size, state.cu, num_prefix, r, class_token=class_token)
    B = state.cu.shape[0] - 1
    m = out.x.shape[0] // B
    new = PackedState(
        out.x,
        out.cu,
        state.seq_id.reshape(-1, n)[:, :m].reshape(-1),
        state.pos.reshape(-1, n)[:, :m].reshape(-1),  # uniform rows: positions 0..m-1 in every image
        next_token_index(state.token_index, out.src, B, fuse=False),
    )
    a0, _ = merge_sets(n, num_prefix)
    S = torch.full((B, n), float("-inf"), dtype=torch.float32, device=state.x.device)
    S = torch.slice_scatter(S, out.score.reshape(B, merge_widths(n, num_prefix)[0]), dim=1, start=a0, step=2)
    counts = state.cu[1:] - state.cu[:-1]
    return new, out.size, out.key_bias, StageTrace(S, counts, counts * 0 + (n - m), counts * 0 + m, out.src)


def backbone_refusal(spec: PruneSpec, backbone: Backbone) -> str | None:
    """Why `spec` cannot run on `backbone` (the reason alone, one line), or None: a stage inside a block needs a
    backbone that runs its blocks in two halves, except EViT's without fuse (its MLP is per row: pruning after the
    whole block keeps the same rows)."""
    if spec.merges and not backbone.supports_merge:
        return backbone.merge_refusal
    if spec.fuse and not backbone.supports_halves:
        return (
            f"EViT's fused token passes through the pruning block's MLP, and {type(backbone).__name__} runs its "
            "blocks whole; use evit without fuse"
        )
    return None


class PrunedViT(nn.Module):
    """A timm ViT with token pruning stages, run on packed variable-length rows.

    forward(images [B, 3, S, S]) -> PrunedOutput. No host reads: data-dependent sizes come from nonzero, so the
    module is torch.export-able with a data-dependent token count; stages whose counts are known before the data
    (topk-l2, evit without fuse, on equal counts per image) have static shapes.

    `capacity=True` selects the capacity layout (DESIGN.md section 4): every stage keeps a static row count
    (B × the rows per image the stage can keep at most), the kept rows first and dead rows after cu[B], so every
    policy has static shapes at a given batch size: the ONNX export has no NonZero and runs as a CUDA graph, and
    torch.compile (mode="reduce-overhead") captures it. Same logits, counts and kept rows as the default
    (compact) layout; stages that are static already (uniform topk-l2 / evit) are the same in both.

    The model family (VisionTransformer, and the others in raggedvit/pruning/families/) is a `Backbone`: the
    embedding, each block on packed rows and the head; this class owns the stages. Each submodule runs in its
    own dtype (see raggedvit.pruning.precision for the export recipes): the embedding output is cast to the
    residual stream's dtype, the head's input to the head's.

    `attention` replaces raggedvit's ragged attention op in every block by a callable with the signature and
    semantics of `raggedvit.kernels.ragged_attention` (a benchmark peer, for instance); None keeps the op.

    `ragged_linear` runs block GEMMs with `raggedvit.kernels.ragged_linear`: rows past cu[B] (the capacity
    layout's dead rows) are not computed, and bias / GELU / residual adds are fused into the GEMMs
    (packed_block.ragged_tail). True or "all": every block; "dead-rows": only the blocks whose rows include dead
    rows (capacity layout, after a stage whose counts depend on the data), the others keep F.linear (cuBLAS wins on
    full rows: docs/decisions.md). Same results up to rounding; timm VisionTransformer only
    (ValueError otherwise).

    `block_outputs` also returns each block's output rows (PrunedOutput.blocks): the validator's per-block drift
    reads them, and the exporter traces them to name each block's output tensor in the graph.
    """

    def __init__(
        self,
        vit: nn.Module,
        spec: PruneSpec,
        attention: AttentionFn | None = None,
        *,
        capacity: bool = False,
        ragged_linear: bool | str = False,
        block_outputs: bool = False,
        scorers: nn.ModuleList | None = None,
    ) -> None:
        super().__init__()
        backbone = backbone_for(vit)
        spec.check_model(depth=backbone.depth, has_class_token=backbone.has_class_token)
        desc = spec.descriptor
        refusal = backbone_refusal(spec, backbone)
        if refusal:
            what = f"policy {spec.policy!r}" + (" with fuse" if spec.fuse else "")
            raise ValueError(f"{what} cannot run {type(vit).__name__}: {refusal}")
        spec = spec.resolve(backbone.depth)
        mode = ragged_linear_mode(ragged_linear)
        if mode is not None and not backbone.supports_ragged_linear:
            raise ValueError(
                f"ragged_linear={ragged_linear!r} needs a timm VisionTransformer; {type(vit).__name__} runs as "
                f"{type(backbone).__name__}, which has no ragged linear path"
            )
        if scorers is None:
            if desc.learned:
                raise ValueError(
                    f"policy {spec.policy!r} has a learned predictor: build the model with "
                    "raggedvit.pruning.build_pruned_vit, which loads it from the checkpoint"
                )
            scorers = nn.ModuleList(scorer_for(desc, backbone.width) for _ in spec.prune_at)
        if len(scorers) != spec.num_stages:
            raise ValueError(f"{spec.num_stages} stages need as many scorers, got {len(scorers)}")
        self.ragged_linear = mode  # None, "all" or "dead-rows"
        self.vit = vit.eval()
        self.backbone: Backbone = backbone
        self.spec = spec
        self.num_prefix = backbone.num_prefix
        self.attention = attention
        self.capacity = bool(capacity)
        self.block_outputs = bool(block_outputs)
        self.scorers = scorers.eval()  # one per stage (raggedvit.pruning.scorers)

    def forward(self, images: torch.Tensor) -> PrunedOutput:
        return self.forward_packed(images)

    def _select(self, run: _Run, stage: int, cls_attn: torch.Tensor | None) -> None:
        """A selecting stage on run.state (between blocks, or inside one after its attention): scores from the
        stage's scorer, then the uniform, capacity or compact stage; updates run."""
        spec, p, n = self.spec, self.num_prefix, run.uniform
        scores = self.scorers[stage](run.state.x, cls_attn, n, p)
        # k known before the data (a count or a schedule on a uniform state): the same for every image
        known = n is not None and spec.descriptor.cut in ("count", "schedule")
        k = spec.stage_keep(stage, n, p, run.patches) if known else 0
        if spec.fuse and known and k >= n - p:
            spec = dataclasses.replace(spec, fuse=False)  # EViT drops nothing here, and fuses nothing either
        keep = spec.count_keep(k, n, p) if known else None
        if n is not None and spec.static_shapes:
            run.state, trace = uniform_prune_stage(run.state, scores, n, p, k, spec, run.steps)
            run.uniform = run.width = p + k
            run.record(trace, count=p + k)
            return
        elif self.capacity:
            # counts known before the data (evit with fuse on a uniform state): the capacity is exact
            bound = (p + k if known else run.width) + int(spec.fuse)
            run.state, trace = capacity_prune_stage(run.state, scores, cls_attn, run.width, bound, p, spec, keep)
            run.uniform = bound if known else None
            run.width = bound
        else:
            run.state, trace = packed_prune_stage(run.state, scores, cls_attn, run.width, p, spec, keep)
            run.uniform = None
            run.width += int(spec.fuse)
        run.record(trace)

    def _ragged(self, run: _Run) -> tuple[bool, bool]:
        """(run the next GEMMs with the ragged linear op, the rows past cu[B] are dead: a data-dependent capacity
        stage ran)."""
        dead_rows = self.capacity and run.uniform is None
        return self.ragged_linear == "all" or (self.ragged_linear == "dead-rows" and dead_rows), dead_rows

    def _merge(self, run: _Run, keys: MergeKeys) -> None:
        """A tome stage on run.state (the rows after the block's attention): updates run."""
        p, r = self.num_prefix, self.spec.r
        assert run.uniform is not None
        run.state, run.size, run.key_bias, trace = merge_stage(
            run.state, run.size, keys, run.uniform, p, r, self.backbone.has_class_token
        )
        run.uniform = run.width = run.uniform - merged_count(run.uniform, p, r)
        run.record(trace, run.size, count=run.uniform)

    def forward_packed(self, images: torch.Tensor) -> PrunedOutput:
        """images [B, 3, S, S] -> PrunedOutput (logits [B, classes], token_counts [B, stages], ...)."""
        bb, spec, desc = self.backbone, self.spec, self.spec.descriptor
        tokens = bb.embed(images)  # [B, N, C]
        B, N, C = tokens.shape
        run = _Run.start(tokens.to(bb.stream_dtype(tokens.dtype)), self.num_prefix)
        stage_of = {bi: s for s, bi in enumerate(spec.prune_at)}
        blocks: list[torch.Tensor] = []
        cls_attn: torch.Tensor | None = None  # the class attention of the block before (between-stage policies)
        for bi in range(bb.depth):
            stage = stage_of.get(bi)
            inside = stage is not None and desc.where == "inside"
            if stage is not None and not inside:
                self._select(run, stage, cls_attn)
            ragged, _ = self._ragged(run)
            key_bias = run.key_bias  # ToMe's proportional attention: log(size), from the merge
            if inside and bb.supports_halves:  # attention, the stage, then the MLP on the rows it left
                att = bb.attend(
                    bi, run.state, max_seqlen=run.width, return_cls_attn=desc.needs_cls_attn, metric=spec.merges,
                    attention=self.attention, ragged_linear=ragged, key_bias=key_bias,
                )  # fmt: skip
                run.state = run.state._replace(x=att.x)
                if spec.merges:
                    assert att.keys is not None
                    self._merge(run, att.keys)
                else:
                    self._select(run, stage, att.cls_attn)
                ragged, dead_rows = self._ragged(run)
                x = bb.feed_forward(bi, run.state, ragged_linear=ragged, dead_rows=dead_rows)
                run.state = run.state._replace(x=x)
                if self.block_outputs:
                    blocks.append(x)
                continue
            # a whole block; an inside stage of a backbone without halves (evit without fuse) selects after it: its
            # MLP is per row, so the rows kept are EViT's (the MLP also runs on the dropped ones)
            need_cls = desc.needs_cls_attn and (inside or (desc.where == "between" and (bi + 1) in stage_of))
            # the last block past its attention runs on the rows the head reads (token pooling), no others
            head = bb.head_rows(run.state) if bi == bb.depth - 1 and not need_cls else None
            kwargs = {} if head is None else {"out_rows": (head[0], run.steps * head[1])}
            if key_bias is not None:
                kwargs["key_bias"] = key_bias
            out = bb.block(
                bi, run.state, max_seqlen=run.width, return_cls_attn=need_cls, attention=self.attention,
                ragged_linear=ragged, **kwargs,
            )  # fmt: skip
            x, cls_attn = out if need_cls else (out, None)
            if self.block_outputs:
                blocks.append(x)
            if head is None:
                run.state = run.state._replace(x=x)
            else:
                rows, k = head
                run.state = PackedState(x, run.steps * k, *(t.index_select(0, rows) for t in run.state[2:]))
                run.width = k
            if inside:
                self._select(run, stage, cls_attn)
        logits = bb.head(run.state, run.width)
        traces = run.traces
        if all(c is not None for c in run.counts):  # no stage, or every count known before the data: constants
            counts = torch.tensor(run.counts, dtype=torch.int64, device=tokens.device)
            token_counts = counts.reshape(1, -1).expand(B, len(run.counts))
        else:
            token_counts = torch.stack([t.kept for t in traces], dim=1)
        return PrunedOutput(
            logits, token_counts, tuple(run.index), tuple(run.cu), tuple(traces), tuple(blocks), tuple(run.sizes)
        )


class _Run:
    """The state of one forward between stages: the packed rows, their static bounds and what the stages recorded.

    state: PackedState; width: static max rows per image; uniform: the rows of every image while all are equal, else
    None; patches: P, patch tokens per image before any stage; steps [B+1] int64 = 0..B (uniform states have cu =
    steps * rows); size: tome's [T] float32 tokens in each row and key_bias its log (None before the first merge);
    per stage: index (token_index), cu, traces, sizes (tome), counts (rows per image when known before the data)."""

    def __init__(self, state: PackedState, width: int, patches: int, steps: torch.Tensor) -> None:
        self.state, self.width, self.uniform, self.patches, self.steps = state, width, width, patches, steps
        self.size: torch.Tensor | None = None
        self.key_bias: torch.Tensor | None = None
        self.counts: list[int | None] = []
        self.index: list[torch.Tensor] = []
        self.cu: list[torch.Tensor] = []
        self.traces: list[StageTrace] = []
        self.sizes: list[torch.Tensor] = []

    @classmethod
    def start(cls, tokens: torch.Tensor, num_prefix: int) -> _Run:
        """tokens [B, N, C] (in the stream dtype) -> the run before the first block."""
        B, N, C = tokens.shape
        rows = torch.arange(B * N, device=tokens.device)
        steps = torch.arange(B + 1, device=tokens.device)
        state = PackedState(tokens.reshape(B * N, C), steps * N, rows // N, rows % N, rows % N)
        return cls(state, N, N - num_prefix, steps)

    def record(self, trace: StageTrace, size: torch.Tensor | None = None, *, count: int | None = None) -> None:
        """Keep a stage's outputs; count: its rows per image when known before the data (the same for every image),
        else None."""
        self.counts.append(count)
        self.index.append(self.state.token_index)
        self.cu.append(self.state.cu)
        self.traces.append(trace)
        if size is not None:
            self.sizes.append(size)
