"""timm's VisionTransformerRelPos as a PrunedViT backbone: RelPosBias / RelPosMlp inside the ragged attention op.

Each block's table (its own rel_pos, else the model's shared_rel_pos) goes to the op as pos_table [H, R] with
token_pos = state.token_index: a kept token keeps the bias of its original position (DESIGN.md section 4).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.models.vision_transformer_relpos import (
    RelPosAttention,
    RelPosBlock,
    ResPostRelPosBlock,
    VisionTransformerRelPos,
)
from torch import nn

from raggedvit.pruning._model import patch_embed
from raggedvit.pruning.backbone import Attended, AttentionFn, Backbone, PackedState, module_dtype
from raggedvit.pruning.families.beit import attend, check_head, token_or_avg_head
from raggedvit.pruning.packed_block import _apply_qk_norm
from raggedvit.pruning.relpos import relpos_table

__all__ = ["RelPosBackbone"]


class RelPosBackbone(Backbone):
    """timm VisionTransformerRelPos: no absolute position embedding, optional class token, RelPosBlock (pre-norm,
    LayerScale) or ResPostRelPosBlock (post-norm residual), per-block or shared RelPosBias / RelPosMlp, 'avg' or
    'token' pooling."""

    model_classes = (VisionTransformerRelPos,)
    supports_halves = True
    merge_refusal = (
        "its relative position bias is looked up by each token's grid cell, and a merged token (several cells) has "
        "none; use topk-l2, evit or cls-mass"
    )

    def __init__(self, model: VisionTransformerRelPos) -> None:
        super().__init__(model)
        check_head(model)
        for i, blk in enumerate(model.blocks):
            if type(blk) not in (RelPosBlock, ResPostRelPosBlock) or type(blk.attn) is not RelPosAttention:
                raise ValueError(f"block {i} is {type(blk).__name__}; only (ResPost)RelPosBlock is supported")
        self.num_prefix = int(model.num_prefix_tokens)
        self.has_class_token = model.cls_token is not None
        self.grid = (int(model.patch_embed.grid_size[0]), int(model.patch_embed.grid_size[1]))
        for blk in model.blocks:  # refuse a window that is not the patch grid now, not in the forward
            self._table(blk.attn)

    def _table(self, attn: RelPosAttention) -> torch.Tensor | None:
        rel_pos = attn.rel_pos if attn.rel_pos is not None else self.model.shared_rel_pos  # timm: its own first
        return None if rel_pos is None else relpos_table(rel_pos, self.grid)

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        m = self.model
        x = patch_embed(m.patch_embed, images)
        if m.cls_token is not None:
            x = torch.cat((m.cls_token.expand(x.shape[0], -1, -1).to(x.dtype), x), dim=1)
        return x

    def _attention(
        self, attn: RelPosAttention, h: torch.Tensor, state: PackedState, max_seqlen: int, return_cls_attn: bool,
        attention: AttentionFn | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
        """RelPosAttention.forward on packed rows h [T, C] -> (proj output [T, C] in attn's dtype, cls_attn)."""
        hc = h.to(attn.qkv.weight.dtype)
        qk_norm = not (isinstance(attn.q_norm, nn.Identity) and isinstance(attn.k_norm, nn.Identity))
        if qk_norm:
            qkv = _apply_qk_norm(attn.qkv(hc), attn.q_norm, attn.k_norm, attn.num_heads, attn.head_dim)
            bias = None
        else:
            qkv, bias = F.linear(hc, attn.qkv.weight), attn.qkv.bias
        res = attend(
            qkv,
            state,
            attn.num_heads,
            scale=attn.scale,
            bias=bias,
            table=self._table(attn),
            grid=self.grid,
            num_prefix=self.num_prefix,
            max_seqlen=max_seqlen,
            return_cls_attn=return_cls_attn,
            attention=attention,
        )
        o, cls_attn = res if return_cls_attn else (res, None)
        return attn.proj_drop(attn.proj(o)), cls_attn

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
        """The attention half of RelPosBlock / ResPostRelPosBlock on packed rows: x + ls1(attn(norm1(x))), or
        x + norm1(attn(x)) post-norm."""
        self.refuse_merge_inputs(metric, key_bias, ragged_linear)
        blk = self.model.blocks[index]
        x = state.x
        if type(blk) is ResPostRelPosBlock:
            o, cls_attn = self._attention(blk.attn, x, state, max_seqlen, return_cls_attn, attention)
            x = x + blk.drop_path1(blk.norm1(o.to(module_dtype(blk.norm1, x.dtype))).to(x.dtype))
        else:
            o, cls_attn = self._attention(blk.attn, blk.norm1(x), state, max_seqlen, return_cls_attn, attention)
            x = x + blk.drop_path1(blk.ls1(o.to(x.dtype)))
        return Attended(x, cls_attn)

    def feed_forward(
        self, index: int, state: PackedState, *, ragged_linear: bool = False, dead_rows: bool = False
    ) -> torch.Tensor:
        """The MLP half: x + ls2(mlp(norm2(x))), or x + norm2(mlp(x)) post-norm."""
        blk = self.model.blocks[index]
        x = state.x
        mlp_dtype = module_dtype(blk.mlp, x.dtype)
        if type(blk) is ResPostRelPosBlock:
            m = blk.mlp(x.to(mlp_dtype))
            return x + blk.drop_path2(blk.norm2(m.to(module_dtype(blk.norm2, x.dtype))).to(x.dtype))
        m = blk.mlp(blk.norm2(x).to(mlp_dtype))
        return x + blk.drop_path2(blk.ls2(m.to(x.dtype)))

    def head(self, state: PackedState, width: int) -> torch.Tensor:
        return token_or_avg_head(self.model, state, width, self.num_prefix)
