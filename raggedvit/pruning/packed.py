"""The pruned ViT on packed tokens: every block runs on [T, C] rows with the ragged attention op."""

from __future__ import annotations

from typing import NamedTuple

import torch
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from raggedvit.pruning._model import check_supported, classify, embed_tokens, is_distilled
from raggedvit.pruning.packed_block import AttentionFn, packed_block_forward
from raggedvit.pruning.select import pad_scores, select_tokens
from raggedvit.pruning.spec import PruneSpec

__all__ = ["EVIT_FUSE_EPS", "PackedState", "PrunedOutput", "PrunedViT", "packed_prune_stage"]

EVIT_FUSE_EPS = 1e-12  # floor of the dropped-attention sum in evit's fused token


class PrunedOutput(NamedTuple):
    """logits [B, classes]; token_counts [B, stages] int64 (tokens per image after each stage, prefix and fused
    token included); token_index: per stage, [T_s] int64 original token index of each kept packed row (-1 for
    an evit fused token); cu_seqlens: per stage, [B+1] int64 of the packed rows after that stage."""

    logits: torch.Tensor
    token_counts: torch.Tensor
    token_index: tuple[torch.Tensor, ...] = ()
    cu_seqlens: tuple[torch.Tensor, ...] = ()


class PackedState(NamedTuple):
    """x [T, C]; cu [B+1] int64; seq_id [T] int64 (image of each row); pos [T] int64 (position within its image);
    token_index [T] int64 (original token index, -1 for fused tokens)."""

    x: torch.Tensor
    cu: torch.Tensor
    seq_id: torch.Tensor
    pos: torch.Tensor
    token_index: torch.Tensor


def packed_prune_stage(
    state: PackedState,
    scores: torch.Tensor,
    cls_attn: torch.Tensor | None,
    width: int,
    num_prefix: int,
    spec: PruneSpec,
) -> tuple[PackedState, torch.Tensor]:
    """One prune stage (DESIGN.md section 4) on packed rows.

    Args:
        state: packed rows after the previous block.
        scores: [T] float32 score of each row (ignored for prefix rows).
        cls_attn: [T] float32 cls attention of the previous block (needed for evit fuse), else None.
        width: static Nmax >= every image's token count.
        num_prefix: p.
        spec: the policy.

    Returns:
        (new state with T' rows, n' [B] int64 tokens per image).
    """
    x, cu, seq_id, pos, token_index = state
    B = cu.shape[0] - 1
    T, C = x.shape
    n = cu[1:] - cu[:-1]
    S = pad_scores(scores, seq_id, pos, B, width, num_prefix)
    keep = select_tokens(S, n, num_prefix, spec).keep  # [B, W]
    x_src, index_src = x, token_index
    if spec.fuse:
        assert cls_attn is not None
        idx = torch.arange(width, device=x.device)
        dropped = (~keep) & (idx < n.unsqueeze(1)) & (idx >= num_prefix)  # [B, W]
        w = cls_attn.to(torch.float32) * dropped[seq_id, pos].to(torch.float32)  # [T]
        num = torch.zeros(B, C, dtype=torch.float32, device=x.device).index_add(0, seq_id, w.unsqueeze(1) * x.float())
        den = torch.zeros(B, dtype=torch.float32, device=x.device).index_add(0, seq_id, w)
        fused = (num / den.clamp_min(EVIT_FUSE_EPS).unsqueeze(1)).to(x.dtype)  # [B, C]
        keep = torch.cat((keep, torch.ones(B, 1, dtype=torch.bool, device=x.device)), dim=1)  # slot W = fused
        x_src = torch.cat((x, fused), dim=0)
        index_src = torch.cat((token_index, torch.full((B,), -1, dtype=token_index.dtype, device=x.device)))
    nz = torch.nonzero(keep)  # [T', 2] row-major: image by image, position order kept
    t_new = nz.shape[0]
    torch._check(t_new >= B)
    torch._check(t_new <= B * keep.shape[1])
    b, i = nz[:, 0], nz[:, 1]
    src = cu[b] + i
    if spec.fuse:
        src = torch.where(i == width, T + b, src)
    n_new = keep.sum(dim=1)
    cu_new = torch.cat((torch.zeros(1, dtype=torch.int64, device=x.device), torch.cumsum(n_new, dim=0)))
    pos_new = (torch.cumsum(keep.to(torch.int64), dim=1) - 1)[b, i]
    new = PackedState(x_src[src], cu_new, b, pos_new, index_src[src])
    return new, n_new


class PrunedViT(nn.Module):
    """A timm VisionTransformer with token pruning stages, run on packed variable-length rows.

    forward(images [B, 3, S, S]) -> PrunedOutput. No host reads: data-dependent sizes come from nonzero, so the
    module is torch.export-able with a data-dependent token count.

    `attention` replaces raggedvit's ragged attention op in every block by a callable with the signature and
    semantics of `raggedvit.kernels.ragged_attention` (a benchmark peer, for instance); None keeps the op.
    """

    def __init__(self, vit: VisionTransformer, spec: PruneSpec, attention: AttentionFn | None = None) -> None:
        super().__init__()
        check_supported(vit)
        spec.check_model(depth=len(vit.blocks), has_class_token=vit.cls_token is not None)
        self.vit = vit.eval()
        self.spec = spec
        self.num_prefix = int(vit.num_prefix_tokens)
        self.attention = attention

    def forward(self, images: torch.Tensor) -> PrunedOutput:
        return self.forward_packed(images)

    def forward_packed(self, images: torch.Tensor) -> PrunedOutput:
        """images [B, 3, S, S] -> PrunedOutput (logits [B, classes], token_counts [B, stages], ...)."""
        vit, spec, p = self.vit, self.spec, self.num_prefix
        tokens = embed_tokens(vit, images)  # [B, N, C]
        B, N, C = tokens.shape
        dev = tokens.device
        rows = torch.arange(B * N, device=dev)
        state = PackedState(
            tokens.reshape(B * N, C), torch.arange(B + 1, device=dev) * N, rows // N, rows % N, rows % N
        )
        width = N
        stages = set(spec.prune_at)
        counts: list[torch.Tensor] = []
        kept_index: list[torch.Tensor] = []
        kept_cu: list[torch.Tensor] = []
        cls_attn: torch.Tensor | None = None
        for bi, blk in enumerate(vit.blocks):
            if bi in stages:
                if spec.policy == "topk-l2":
                    scores = torch.linalg.vector_norm(state.x.float(), dim=-1)
                else:
                    assert cls_attn is not None
                    scores = cls_attn
                state, n_new = packed_prune_stage(state, scores, cls_attn, width, p, spec)
                width += int(spec.fuse)
                counts.append(n_new)
                kept_index.append(state.token_index)
                kept_cu.append(state.cu)
            need_cls = spec.needs_cls_attn and (bi + 1) in stages
            out = packed_block_forward(
                blk, state.x, state.cu, max_seqlen=width, return_cls_attn=need_cls, attention=self.attention
            )
            if need_cls:
                x, cls_attn = out
            else:
                x = out
            state = state._replace(x=x)
        logits = self._head(state, B)
        token_counts = torch.stack(counts, dim=1) if counts else torch.zeros(B, 0, dtype=torch.int64, device=dev)
        return PrunedOutput(logits, token_counts, tuple(kept_index), tuple(kept_cu))

    def _head(self, state: PackedState, batch: int) -> torch.Tensor:
        """Final norm, pooling per image, classifier -> logits [B, classes]."""
        vit = self.vit
        x = vit.norm(state.x)
        starts = state.cu[:-1]
        first = x[starts]
        second = x[starts + 1] if is_distilled(vit) else None
        pooled = None
        if vit.global_pool != "token":
            C = x.shape[1]
            include = state.pos >= (0 if vit.pool_include_prefix else self.num_prefix)  # [T]
            pooled = _packed_pool(x, state.seq_id, include, batch, C, vit.global_pool)
        return classify(vit, first, second, pooled)


def _packed_pool(x: torch.Tensor, seq_id: torch.Tensor, include: torch.Tensor, batch: int, C: int, pool: str):
    """Per-image mean / max over included rows: x [T, C] -> [B, C]."""
    out = []
    if pool in ("avg", "avgmax"):  # sums in float32 (half inputs), result in x.dtype
        w = include.to(torch.float32)
        total = torch.zeros(batch, C, dtype=torch.float32, device=x.device).index_add(0, seq_id, x.float() * w[:, None])
        count = torch.zeros(batch, dtype=torch.float32, device=x.device).index_add(0, seq_id, w)
        out.append((total / count.unsqueeze(1)).to(x.dtype))
    if pool in ("max", "avgmax"):
        src = torch.where(include.unsqueeze(1), x, float("-inf"))
        init = torch.full((batch, C), float("-inf"), dtype=x.dtype, device=x.device)
        out.append(init.scatter_reduce(0, seq_id.unsqueeze(1).expand(-1, C), src, reduce="amax"))
    if pool == "avgmax":
        return 0.5 * (out[1] + out[0])
    return out[0]
