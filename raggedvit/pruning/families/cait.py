"""timm's CaiT (Class-Attention in Image Transformers) as a PrunedViT backbone.

The patch stack (`blocks`: LayerScaleBlock with TalkingHeadAttn) has no class token: a prune index counts these
blocks, topk-l2 applies, the cls-attention policies are refused (has_class_token False). Talking-heads attention
mixes heads with a linear map before and after the softmax, which the ragged op cannot run: it runs on the padded
layout [B, W, C] with a key-padding mask. The class-attention tail (`blocks_token_only`: the class token attends
over [cls, its image's kept patch rows]), the final norm and the classifier run in `head`, also padded with a key
mask. Positions: CaiT adds its absolute pos_embed in the embedding, so a kept row carries its position with it;
no block reads token_index.
"""

from __future__ import annotations

import torch
from timm.models.cait import Cait, ClassAttn, LayerScaleBlock, LayerScaleBlockClassAttn, TalkingHeadAttn
from torch import nn

from raggedvit.pruning._model import patch_embed
from raggedvit.pruning.backbone import AttentionFn, Backbone, PackedState, module_dtype
from raggedvit.pruning.families.vit import padded_pool
from raggedvit.pruning.select import pad_rows, padded_slots

__all__ = ["CaitBackbone", "check_cait"]

_POOLS = ("token", "avg")


def check_cait(model: Cait) -> None:
    """Raise ValueError (one line) unless CaitBackbone runs `model`."""
    if model.global_pool not in _POOLS:
        raise ValueError(f"CaiT global_pool {model.global_pool!r} is not supported; expected 'token' or 'avg'")
    if model.blocks_token_only is None or model.cls_token is None:
        raise ValueError("CaiT without its class-attention blocks (prune_intermediate_layers) is not supported")
    for i, blk in enumerate(model.blocks):
        if type(blk) is not LayerScaleBlock or type(blk.attn) is not TalkingHeadAttn:
            raise ValueError(
                f"CaiT block {i} is {type(blk).__name__}/{type(blk.attn).__name__}; expected "
                "LayerScaleBlock with TalkingHeadAttn"
            )
    for i, blk in enumerate(model.blocks_token_only):
        if type(blk) is not LayerScaleBlockClassAttn or type(blk.attn) is not ClassAttn:
            raise ValueError(
                f"CaiT class-attention block {i} is {type(blk).__name__}/{type(blk.attn).__name__}; "
                "expected LayerScaleBlockClassAttn with ClassAttn"
            )


def _heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, W, H*D] -> [B, H, W, D]."""
    B, W, E = t.shape
    return t.reshape(B, W, heads, E // heads).transpose(1, 2)


def _mix_heads(attn: torch.Tensor, proj: nn.Linear) -> torch.Tensor:
    """A Linear over the head axis of attn [B, H, Q, K] (timm's talking-heads proj_l / proj_w)."""
    return proj(attn.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def talking_heads_attention(attn: TalkingHeadAttn, h: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """timm's TalkingHeadAttn.forward on padded rows with a key-padding mask.

    Args:
        attn: the module.
        h: [B, W, C] norm1 output in the padded layout (padding slots hold any finite rows).
        valid: [B, W] bool, the real slots.

    Returns:
        [B, W, C] heads merged, before proj (padding slots' rows are meaningless: gather the real ones). Padding
        keys get -inf before the softmax and exactly zero weight after proj_w (whose bias would give them weight);
        rows never mix across queries, so padding queries cannot reach real rows.
    """
    B, W, C = h.shape
    H = attn.num_heads
    q, k, v = (_heads(t, H) for t in attn.qkv(h).chunk(3, dim=-1))  # each [B, H, W, D]
    scores = _mix_heads(torch.matmul(q * attn.scale, k.transpose(-2, -1)), attn.proj_l)  # [B, H, W, W]
    key = valid[:, None, None, :]
    weights = _mix_heads(scores.masked_fill(~key, float("-inf")).softmax(dim=-1), attn.proj_w)
    weights = torch.where(key, weights, 0.0)
    return torch.matmul(weights, v).transpose(1, 2).reshape(B, W, C)


def class_attention(attn: ClassAttn, cls: torch.Tensor, u: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """timm's ClassAttn.forward with a key-padding mask: the class token attends over [cls, the image's rows].

    Args:
        attn: the module.
        cls: [B, C] norm1 of the class token (row 0 of timm's u).
        u: [B, 1 + W, C] norm1 of [cls, padded patch rows].
        valid: [B, 1 + W] bool, the real slots (slot 0, the class token, always).

    Returns:
        [B, C] after proj."""
    B, L, C = u.shape
    H = attn.num_heads
    q = attn.q(cls).reshape(B, H, 1, C // H)
    k, v = _heads(attn.k(u), H), _heads(attn.v(u), H)  # [B, H, L, D]
    scores = torch.matmul(q * attn.scale, k.transpose(-2, -1)).masked_fill(~valid[:, None, None, :], float("-inf"))
    out = torch.matmul(scores.softmax(dim=-1), v).reshape(B, C)  # [B, H, 1, D] -> heads merged
    return attn.proj_drop(attn.proj(out))


class CaitBackbone(Backbone):
    """timm Cait: talking-heads patch blocks on the padded layout, then the class-attention tail in the head."""

    model_classes = (Cait,)
    merge_refusal = (
        "CaiT's talking-heads attention mixes the heads before the softmax on a padded layout, which has no "
        "proportional attention or merge path; use topk-l2"
    )

    def __init__(self, model: Cait) -> None:
        super().__init__(model)
        check_cait(model)
        self.num_prefix = 0
        self.has_class_token = False  # the class token joins only in the tail, after every prune stage

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        m = self.model
        x = patch_embed(m.patch_embed, images)
        return m.pos_drop(x + m.pos_embed.to(x.dtype))

    def block(
        self,
        index: int,
        state: PackedState,
        *,
        max_seqlen: int,
        return_cls_attn: bool,
        attention: AttentionFn | None,
        ragged_linear: bool = False,
    ) -> torch.Tensor:
        """LayerScaleBlock on packed rows: norm1 on the rows, talking-heads attention padded to max_seqlen, the
        rest on the rows. `attention` does not apply (the ragged op cannot mix heads)."""
        if return_cls_attn:
            raise ValueError("CaiT's patch blocks have no class token: no cls attention to return")
        blk: LayerScaleBlock = self.model.blocks[index]
        x, cu = state.x, state.cu
        rows, valid = padded_slots(cu, cu[1:] - cu[:-1], max_seqlen)  # [B, W]
        h = blk.norm1(x)
        o = talking_heads_attention(blk.attn, pad_rows(h.to(module_dtype(blk.attn, h.dtype)), rows), valid)
        o = o.reshape(-1, o.shape[-1]).index_select(0, state.seq_id * max_seqlen + state.pos)  # [T, C]: real rows
        o = blk.attn.proj_drop(blk.attn.proj(o))
        x = x + blk.drop_path(blk.gamma_1 * o.to(x.dtype))
        m = blk.mlp(blk.norm2(x).to(module_dtype(blk.mlp, x.dtype)))
        return x + blk.drop_path(blk.gamma_2 * m.to(x.dtype))

    def head(self, state: PackedState, width: int) -> torch.Tensor:
        """The class-attention tail over each image's kept rows, the final norm, pooling, classifier ->
        logits [B, classes] (features [B, C] for headless models)."""
        m = self.model
        cu = state.cu
        B = cu.shape[0] - 1
        rows, valid = padded_slots(cu, cu[1:] - cu[:-1], width)  # [B, W]
        valid_u = torch.cat((torch.ones(B, 1, dtype=torch.bool, device=cu.device), valid), dim=1)  # [B, 1 + W]
        dtype = module_dtype(m.blocks_token_only[0], state.x.dtype)
        x = state.x.to(dtype)
        cls = m.cls_token.to(dtype).reshape(1, -1).expand(B, -1)  # [B, C]
        for blk in m.blocks_token_only:
            h_cls = blk.norm1(cls)
            u = torch.cat((h_cls.unsqueeze(1), pad_rows(blk.norm1(x), rows)), dim=1)  # [B, 1 + W, C]
            ad = module_dtype(blk.attn, u.dtype)
            o = class_attention(blk.attn, h_cls.to(ad), u.to(ad), valid_u)
            cls = cls + blk.drop_path(blk.gamma_1 * o.to(cls.dtype))
            mlp = blk.mlp(blk.norm2(cls).to(module_dtype(blk.mlp, cls.dtype)))
            cls = cls + blk.drop_path(blk.gamma_2 * mlp.to(cls.dtype))
        hd = module_dtype(m.norm, module_dtype(m.head, torch.float32))
        if m.global_pool == "token":  # the norm is per row: normalise only the rows the head reads
            feats = m.norm(cls.to(hd))
        else:
            feats = padded_pool(pad_rows(m.norm(x.to(hd)), rows), valid, "avg")
        return m.head(m.head_drop(feats))

    def half_modules(self, recipe: str) -> list[nn.Module]:
        m = self.model
        blocks = [*m.blocks, *m.blocks_token_only]
        if recipe == "fp16-all":
            return blocks
        return [sub for blk in blocks for sub in (blk.attn, blk.mlp)]
