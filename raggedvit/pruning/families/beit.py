"""timm's Beit (BEiT, BEiT-v2) as a PrunedViT backbone: relative position bias inside the ragged attention op.

Each block's bias table (its own relative_position_bias_table, plus the model's shared one) goes to the op as
pos_table [H, R] with token_pos = state.token_index, so a kept token keeps the bias of its original position
(DESIGN.md section 4). The class token is never pruned; an evit fused token (token_index -1) gets the class entries.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.models.beit import Attention as BeitAttention
from timm.models.beit import Beit
from timm.models.beit import Block as BeitBlock
from torch import nn

from raggedvit.kernels import ragged_attention
from raggedvit.pruning._model import patch_embed
from raggedvit.pruning.backbone import Attended, AttentionFn, Backbone, PackedState, module_dtype
from raggedvit.pruning.families.vit import padded_pool
from raggedvit.pruning.relpos import beit_table
from raggedvit.pruning.select import pad_rows, padded_slots

__all__ = ["BeitBackbone", "attend", "token_or_avg_head"]

HEAD_POOLS = ("avg", "token")


def attend(
    qkv: torch.Tensor,
    state: PackedState,
    heads: int,
    *,
    scale: float,
    bias: torch.Tensor | None,
    table: torch.Tensor | None,
    grid: tuple[int, int],
    num_prefix: int,
    max_seqlen: int,
    return_cls_attn: bool,
    attention: AttentionFn | None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Ragged attention of packed rows with an optional relative position table.

    qkv [T, 3*H*D] (without its bias); bias [3*H*D] or None; table [H, R] float32 or None (then no position bias);
    the table's positions are state.token_index (original token indices). -> out [T, H*D] (, cls_attn [T] f32).
    raggedvit's op takes the bias on load; another `attention` gets qkv + bias."""
    kwargs = {"scale": scale, "max_seqlen": max_seqlen, "return_cls_attn": return_cls_attn}
    if table is not None:
        kwargs.update(pos_table=table, token_pos=state.token_index, grid=grid, num_prefix=num_prefix)
    if attention is None:
        return ragged_attention(qkv, state.cu, heads, bias=bias, **kwargs)
    if bias is not None:
        qkv = qkv + bias
    return attention(qkv.contiguous(), state.cu, heads, **kwargs)


def token_or_avg_head(model: nn.Module, state: PackedState, width: int, num_prefix: int) -> torch.Tensor:
    """timm's forward_head of Beit / VisionTransformerRelPos on packed rows: norm, then the class token
    ('token') or the mean of each image's kept patch rows ('avg'), fc_norm, head -> [B, classes]."""
    dtype = module_dtype(model.norm, module_dtype(model.fc_norm, module_dtype(model.head, torch.float32)))
    if model.global_pool == "token":  # norm is per row: only the rows the head reads
        feats = model.norm(state.x.index_select(0, state.cu[:-1]).to(dtype))
    else:
        x = model.norm(state.x.to(dtype))
        n = state.cu[1:] - state.cu[:-1]
        rows, valid = padded_slots(state.cu, n, width)
        include = valid & (torch.arange(width, device=x.device) >= num_prefix)  # [B, W]
        feats = padded_pool(pad_rows(x, rows), include, "avg")
    feats = model.fc_norm(feats.to(module_dtype(model.fc_norm, feats.dtype)))
    return model.head(model.head_drop(feats).to(module_dtype(model.head, feats.dtype)))


def check_head(model: nn.Module) -> None:
    if model.global_pool not in HEAD_POOLS:
        raise ValueError(
            f"global_pool {model.global_pool!r} is not supported for {type(model).__name__}; expected 'avg' or 'token'"
        )


class BeitBackbone(Backbone):
    """timm Beit: class token, optional absolute position embedding, BEiT blocks (q/v bias, gamma_1 / gamma_2
    layer scale, per-block and/or shared relative position bias), 'avg' (with fc_norm) or 'token' pooling."""

    model_classes = (Beit,)
    supports_halves = True
    merge_refusal = (
        "BEiT's relative position bias is looked up by each token's grid cell, and a merged token (several cells) "
        "has none; use topk-l2, evit or cls-mass"
    )

    def __init__(self, model: Beit) -> None:
        super().__init__(model)
        check_head(model)
        for i, blk in enumerate(model.blocks):
            if type(blk) is not BeitBlock or type(blk.attn) is not BeitAttention:
                raise ValueError(f"block {i} is {type(blk).__name__}; only timm's Beit Block is supported")
        self.num_prefix = int(model.num_prefix_tokens)
        self.has_class_token = True
        self.grid = (int(model.patch_embed.grid_size[0]), int(model.patch_embed.grid_size[1]))
        for blk in model.blocks:  # refuse a window that is not the patch grid now, not in the forward
            beit_table(blk.attn, model.rel_pos_bias, self.grid)

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        m = self.model
        x = patch_embed(m.patch_embed, images)
        x = torch.cat((m.cls_token.expand(x.shape[0], -1, -1).to(x.dtype), x), dim=1)
        if m.pos_embed is not None:
            x = x + m.pos_embed.to(x.dtype)
        return m.pos_drop(x)

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
        """The attention half of timm.models.beit.Block on packed rows: x + gamma_1 * attn(norm1(x))."""
        self.refuse_merge_inputs(metric, key_bias, ragged_linear)
        blk = self.model.blocks[index]
        attn = blk.attn
        x = state.x
        h = blk.norm1(x)
        qkv = F.linear(h.to(attn.qkv.weight.dtype), attn.qkv.weight)
        bias = None if attn.q_bias is None else torch.cat((attn.q_bias, attn.k_bias, attn.v_bias))
        res = attend(
            qkv,
            state,
            attn.num_heads,
            scale=attn.scale,
            bias=bias,
            table=beit_table(attn, self.model.rel_pos_bias, self.grid),
            grid=self.grid,
            num_prefix=self.num_prefix,
            max_seqlen=max_seqlen,
            return_cls_attn=return_cls_attn,
            attention=attention,
        )
        o, cls_attn = res if return_cls_attn else (res, None)
        o = attn.proj_drop(attn.proj(o)).to(x.dtype)
        return Attended(x + blk.drop_path1(o if blk.gamma_1 is None else blk.gamma_1.to(x.dtype) * o), cls_attn)

    def feed_forward(
        self, index: int, state: PackedState, *, ragged_linear: bool = False, dead_rows: bool = False
    ) -> torch.Tensor:
        """The MLP half: x + gamma_2 * mlp(norm2(x))."""
        blk = self.model.blocks[index]
        x = state.x
        m = blk.mlp(blk.norm2(x).to(module_dtype(blk.mlp, x.dtype))).to(x.dtype)
        return x + blk.drop_path2(m if blk.gamma_2 is None else blk.gamma_2.to(x.dtype) * m)

    def head(self, state: PackedState, width: int) -> torch.Tensor:
        return token_or_avg_head(self.model, state, width, self.num_prefix)
