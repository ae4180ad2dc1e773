"""timm's `Eva` (EVA, EVA02, EVA-CLIP, the rope ViTs, Perception Encoder, DINOv3, LingBot, Sapiens2) as a PrunedViT
backbone.

What the family adds to the ViT: rotary position embeddings (axial `RotaryEmbeddingCat`, `RotaryEmbeddingDinoV3`,
per-block per-head `RotaryEmbeddingMixed`) applied to the patch rows of q and k, fused or separate q/k/v
projections (q/v bias, grouped k/v heads), qk norm, the sub-LN `attn.norm`, a gated attention output, SwiGLU /
GluMlp / Mlp (timm's own modules), LayerScale `gamma_1` / `gamma_2`, post-norm blocks, register tokens, and
dynamic-size NHWC patch embeddings. Position contract: the rope rows of a packed row come from its original token
index (raggedvit.pruning.rope), never from its packed row; absolute position embeddings are added before any stage.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch
from timm.layers import RotaryEmbeddingCat, RotaryEmbeddingDinoV3, RotaryEmbeddingMixed
from timm.models.eva import Eva

from raggedvit.pruning._model import POOLS, patch_embed
from raggedvit.pruning.backbone import Attended, AttentionFn, Backbone, PackedState, module_dtype
from raggedvit.pruning.families._eva_block import ATTENTIONS, BLOCKS, eva_attend, eva_block_forward, eva_feed_forward
from raggedvit.pruning.families.vit import padded_pool
from raggedvit.pruning.rope import extend_rope_table, rope_rows
from raggedvit.pruning.select import pad_rows, padded_slots

__all__ = ["EvaBackbone", "check_eva"]

ROPES = (RotaryEmbeddingCat, RotaryEmbeddingDinoV3, RotaryEmbeddingMixed)


def check_eva(model: Eva) -> None:
    """Raise ValueError (one line) unless PrunedViT can run the timm Eva `model`."""
    if model.global_pool == "map":
        _map_head().check_map_pool(model.attn_pool)
    elif model.global_pool not in POOLS:
        raise ValueError(f"global_pool {model.global_pool!r} is not supported; expected one of {', '.join(POOLS)}")
    rope = model.rope
    if rope is not None and not isinstance(rope, ROPES):
        raise ValueError(
            f"rope {type(rope).__name__} is not supported; expected one of {', '.join(r.__name__ for r in ROPES)}"
        )
    p = int(model.num_prefix_tokens)
    for i, blk in enumerate(model.blocks):
        if type(blk) not in BLOCKS:
            names = ", ".join(b.__name__ for b in BLOCKS)
            raise ValueError(f"block {i} is {type(blk).__name__}; expected one of {names}")
        if type(blk.attn) not in ATTENTIONS:
            names = ", ".join(a.__name__ for a in ATTENTIONS)
            raise ValueError(f"block {i} attention is {type(blk.attn).__name__}; expected one of {names}")
        if blk.attn.num_prefix_tokens != p:
            raise ValueError(
                f"block {i} attention leaves {blk.attn.num_prefix_tokens} prefix tokens unrotated, the model has {p}"
            )


def _map_head() -> ModuleType:
    """raggedvit.pruning.map_head (the packed MAP pool), or ValueError where this build lacks it."""
    try:
        return importlib.import_module("raggedvit.pruning.map_head")
    except ModuleNotFoundError:
        raise ValueError(
            "attention pooling (global_pool='map') needs raggedvit.pruning.map_head, which this build lacks; "
            "use global_pool 'token' or 'avg'"
        ) from None


class EvaBackbone(Backbone):
    """timm Eva: embedding with rope table, Eva blocks on packed rows with rope by original token index, token /
    avg / max / avgmax pooling, 'map' attention pooling where raggedvit.pruning.map_head is present.

    `embed` keeps the forward's rope table (from timm's own `_pos_embed`, for the images' grid) for the blocks of
    the same forward: [Np + 1, 2D], or [depth, H, Np + 1, 2D] for mixed rope (row 0 the identity)."""

    model_classes = (Eva,)
    supports_halves = True
    merge_refusal = (
        "Eva blocks rotate q and k by each token's grid position (rope), and a merged token (several positions) has "
        "none; use topk-l2, evit or cls-mass"
    )

    def __init__(self, model: Eva) -> None:
        super().__init__(model)
        check_eva(model)
        self.num_prefix = int(model.num_prefix_tokens)
        self.has_class_token = model.cls_token is not None
        self._rope_table: torch.Tensor | None = None

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """images [B, 3, H, W] -> tokens [B, N, C]: patch embedding, class / register tokens, absolute position
        embedding, norm_pre (timm's `_pos_embed`); also sets the rope table of this forward."""
        m = self.model
        x, rope = m._pos_embed(patch_embed(m.patch_embed, images))
        self._rope_table = None if rope is None else extend_rope_table(rope)
        return m.norm_pre(x)

    def _rope(self, index: int, state: PackedState) -> torch.Tensor | None:
        """The rows' rotary sin | cos for blocks[index] ([T, 1 or H, 2D]), or None without rope."""
        if self._rope_table is None:
            return None
        table = self._rope_table[index] if self.model.rope_mixed else self._rope_table
        return rope_rows(table, state.token_index, self.num_prefix)

    def block(
        self,
        index: int,
        state: PackedState,
        *,
        max_seqlen: int,
        return_cls_attn: bool,
        attention: AttentionFn | None,
        ragged_linear: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        return eva_block_forward(
            self.model.blocks[index],
            state.x,
            state.cu,
            self._rope(index, state),
            max_seqlen=max_seqlen,
            return_cls_attn=return_cls_attn,
            attention=attention,
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
        self.refuse_merge_inputs(metric, key_bias, ragged_linear)
        x, cls_attn = eva_attend(
            self.model.blocks[index], state.x, state.cu, self._rope(index, state), max_seqlen=max_seqlen,
            return_cls_attn=return_cls_attn, attention=attention,
        )  # fmt: skip
        return Attended(x, cls_attn)

    def feed_forward(
        self, index: int, state: PackedState, *, ragged_linear: bool = False, dead_rows: bool = False
    ) -> torch.Tensor:
        return eva_feed_forward(self.model.blocks[index], state.x)

    def head(self, state: PackedState, width: int) -> torch.Tensor:
        """Final norm, pooling per image (prefix rows excluded from avg / max, as timm; 'map' attention pooling
        over every row), fc_norm, classifier ->
        logits [B, classes] (features [B, C] for headless models)."""
        m = self.model
        dtype = module_dtype(m.norm, module_dtype(m.fc_norm, module_dtype(m.head, torch.float32)))
        if m.global_pool == "token":  # the norm is per row: normalise only the rows the head reads
            feats = m.norm(state.x.index_select(0, state.cu[:-1]).to(dtype))
        elif m.global_pool == "map":  # timm pools every row, prefix included
            feats = _map_head().map_pool(m.attn_pool, m.norm(state.x.to(dtype)), state.cu, width)
        else:
            x = m.norm(state.x.to(dtype))
            n = state.cu[1:] - state.cu[:-1]
            rows, valid = padded_slots(state.cu, n, width)
            include = valid & (torch.arange(width, device=x.device) >= self.num_prefix)  # [B, W]
            feats = padded_pool(pad_rows(x, rows), include, m.global_pool)
        return m.head(m.head_drop(m.fc_norm(feats)))
