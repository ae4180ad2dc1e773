"""timm's VisionTransformer (and subclasses such as DeiT's distilled ViT) as a PrunedViT backbone."""

from __future__ import annotations

import torch
from timm.models.vision_transformer import VisionTransformer

from raggedvit.pruning._model import check_vit, classify, embed_tokens, is_distilled
from raggedvit.pruning.backbone import AttentionFn, Backbone, PackedState, module_dtype
from raggedvit.pruning.map_head import map_pool
from raggedvit.pruning.packed_block import Attended, packed_attend, packed_block_forward, packed_feed_forward
from raggedvit.pruning.select import pad_rows, padded_slots

__all__ = ["ViTBackbone", "padded_pool"]


class ViTBackbone(Backbone):
    """timm VisionTransformer: pre-norm `Block`s with timm's `Attention`; token / avg / max pooling, or SigLIP's
    attention pooling (global_pool 'map', pruning/map_head.py) over each image's kept rows."""

    model_classes = (VisionTransformer,)
    supports_ragged_linear = True
    supports_halves = True
    supports_merge = True

    def __init__(self, model: VisionTransformer) -> None:
        super().__init__(model)
        check_vit(model)
        self.num_prefix = int(model.num_prefix_tokens)
        self.has_class_token = model.cls_token is not None

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        return embed_tokens(self.model, images)

    def block(
        self,
        index: int,
        state: PackedState,
        *,
        max_seqlen: int,
        return_cls_attn: bool,
        attention: AttentionFn | None,
        ragged_linear: bool = False,
        out_rows: tuple[torch.Tensor, torch.Tensor] | None = None,
        key_bias: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        return packed_block_forward(
            self.model.blocks[index],
            state.x,
            state.cu,
            max_seqlen=max_seqlen,
            return_cls_attn=return_cls_attn,
            attention=attention,
            ragged_linear=ragged_linear,
            out_rows=out_rows,
            key_bias=key_bias,
        )

    def attend(
        self,
        index: int,
        state: PackedState,
        *,
        max_seqlen: int,
        return_cls_attn: bool,
        metric: bool,
        attention: AttentionFn | None,
        ragged_linear: bool = False,
        key_bias: torch.Tensor | None = None,
    ) -> Attended:
        return packed_attend(
            self.model.blocks[index],
            state.x,
            state.cu,
            max_seqlen=max_seqlen,
            return_cls_attn=return_cls_attn,
            attention=attention,
            ragged_linear=ragged_linear,
            key_bias=key_bias,
            metric=metric,
        )

    def feed_forward(
        self, index: int, state: PackedState, *, ragged_linear: bool = False, dead_rows: bool = False
    ) -> torch.Tensor:
        return packed_feed_forward(
            self.model.blocks[index], state.x, state.cu if dead_rows else None, ragged_linear=ragged_linear
        )

    def head_rows(self, state: PackedState) -> tuple[torch.Tensor, int] | None:
        """Token pooling reads each image's class row (and the distillation row after it): those rows."""
        if self.model.global_pool != "token":
            return None
        starts = state.cu[:-1]
        if not is_distilled(self.model):
            return starts, 1
        return torch.stack((starts, starts + 1), dim=1).reshape(-1), 2

    def head(self, state: PackedState, width: int) -> torch.Tensor:
        """Final norm, pooling per image, classifier -> logits [B, classes] in the head's dtype (features [B, C]
        for headless models)."""
        vit = self.model
        dtype = module_dtype(vit.norm, module_dtype(vit.head, torch.float32))
        starts = state.cu[:-1]
        if vit.global_pool == "token":  # the norm is per row: normalise only the rows the head reads
            first = vit.norm(state.x.index_select(0, starts).to(dtype))
            second = vit.norm(state.x.index_select(0, starts + 1).to(dtype)) if is_distilled(vit) else None
            return classify(vit, first, second, None)
        x = vit.norm(state.x.to(dtype))
        skip = 0 if vit.pool_include_prefix else self.num_prefix
        if vit.attn_pool is not None:  # global_pool 'map' (check_vit refuses other attention pools)
            pooled = map_pool(vit.attn_pool, x, state.cu, width, skip=skip)
            return classify(vit, pooled, None, pooled)
        n = state.cu[1:] - state.cu[:-1]
        rows, valid = padded_slots(state.cu, n, width)
        slot = torch.arange(width, device=x.device)
        include = valid & (slot >= skip)  # [B, W]
        pooled = padded_pool(pad_rows(x, rows), include, vit.global_pool)
        return classify(vit, pooled, None, pooled)


def padded_pool(x: torch.Tensor, include: torch.Tensor, pool: str) -> torch.Tensor:
    """Per-image mean / max over the included slots: x [B, W, C], include [B, W] -> [B, C] in x's dtype
    (mean summed in float32)."""
    m = include.unsqueeze(2)
    out = []
    if pool in ("avg", "avgmax"):
        total = torch.where(m, x.float(), 0.0).sum(dim=1)
        out.append((total / include.sum(dim=1, keepdim=True).to(torch.float32)).to(x.dtype))
    if pool in ("max", "avgmax"):
        out.append(x.masked_fill(~m, float("-inf")).amax(dim=1))
    if pool == "avgmax":
        return 0.5 * (out[1] + out[0])
    return out[0]
