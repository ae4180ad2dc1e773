"""Small seeded BEiT and VisionTransformerRelPos models (non-square patch grid: a transposed index shows) and
timm's own dense forward with a key mask, for the relative-position family tests."""

from __future__ import annotations

from contextlib import ExitStack
from unittest import mock

import torch
from timm.models.beit import Beit
from timm.models.vision_transformer_relpos import ResPostRelPosBlock, VisionTransformerRelPos

from raggedvit.weights import perturb_biases_and_norms_, sharpen_qk_

IMG = (48, 64)  # patch 16: a 3x4 grid
TINY = {"img_size": IMG, "patch_size": 16, "embed_dim": 64, "depth": 2, "num_heads": 4, "num_classes": 10}

# name -> (class, kwargs): every block / bias / pooling variant of the two families
MODELS = {
    "beit": (Beit, {"use_abs_pos_emb": False, "use_rel_pos_bias": True, "init_values": 1.0}),
    "beit-shared-abs-token": (
        Beit,
        {"use_rel_pos_bias": True, "use_shared_rel_pos_bias": True, "qkv_bias": False, "global_pool": "token"},
    ),
    "beit-shared-swiglu": (Beit, {"use_shared_rel_pos_bias": True, "swiglu_mlp": True, "scale_mlp": True}),
    "relpos-mlp": (VisionTransformerRelPos, {"qkv_bias": False, "fc_norm": True}),
    "relpos-rpn": (VisionTransformerRelPos, {"block_fn": ResPostRelPosBlock, "init_values": 0.5}),
    "relpos-swin-cls": (
        VisionTransformerRelPos,
        {"rel_pos_type": "mlp_swin", "class_token": True, "global_pool": "token"},
    ),
    "relpos-bias-cls-gap": (VisionTransformerRelPos, {"rel_pos_type": "bias", "class_token": True, "fc_norm": True}),
    "srelpos-bias-qknorm": (VisionTransformerRelPos, {"rel_pos_type": "bias", "shared_rel_pos": True, "qk_norm": True}),
}
WITH_CLASS_TOKEN = [k for k, (cls, kw) in MODELS.items() if cls is Beit or kw.get("class_token")]


def build(name: str, seed: int = 0) -> torch.nn.Module:
    """The model, eval mode, with random biases / norms / gammas, sharpened q/k, strong position biases (tables
    N(0, 1), RelPosMlp weights N(0, 1): timm's init makes the bias nearly constant) and a head of unit gain."""
    cls, kwargs = MODELS[name]
    torch.manual_seed(seed)
    model = cls(**TINY, **kwargs)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "relative_position_bias_table" in pname or ".mlp.fc" in pname and "rel_pos" in pname:
                p.copy_(torch.randn(p.shape, generator=gen))
        # BEiT scales its head by 1e-3: logits would be the head bias alone
        model.head.weight.copy_(torch.randn(model.head.weight.shape, generator=gen) / model.embed_dim**0.5)
    perturb_biases_and_norms_(model, seed=seed)
    sharpen_qk_(model, 2.0)
    return model.eval()


def key_mask(keep: torch.Tensor) -> torch.Tensor:
    """keep [B, N] bool -> additive attention mask [B, 1, 1, N]: 0 for kept keys, -inf for the others."""
    return torch.zeros(keep.shape, dtype=torch.float32).masked_fill(~keep, float("-inf"))[:, None, None, :]


def masked_dense_forward(model: torch.nn.Module, images: torch.Tensor, keep: torch.Tensor, at: int) -> torch.Tensor:
    """timm's own modules on all N tokens, blocks from `at` on attending to the kept tokens only (keep [B, N]), the
    head pooling the kept patch tokens: what a prune stage at `at` must compute. -> logits [B, classes]."""
    p = model.num_prefix_tokens
    x = model.patch_embed(images)
    x = torch.cat((model.cls_token.expand(x.shape[0], -1, -1), x), dim=1) if model.cls_token is not None else x
    if getattr(model, "pos_embed", None) is not None:
        x = x + model.pos_embed
    mask = key_mask(keep)
    beit = isinstance(model, Beit)
    shared = model.rel_pos_bias() if beit and model.rel_pos_bias is not None else None
    if not beit and model.shared_rel_pos is not None:
        shared = model.shared_rel_pos.get_bias()
    for i, blk in enumerate(model.blocks):
        extra = shared if i < at else (mask if shared is None else shared + mask)
        with ExitStack() as stack:
            rel_pos = None if beit else blk.attn.rel_pos
            if rel_pos is not None and i >= at:  # timm reads a block's own RelPos bias only: add the mask to it
                bias = rel_pos.get_bias()
                stack.enter_context(mock.patch.object(rel_pos, "get_bias", lambda bias=bias: bias + mask))
            x = blk(x, shared_rel_pos_bias=extra) if beit else blk(x, shared_rel_pos=extra)
    x = model.norm(x)
    if model.global_pool == "token":
        feats = x[:, 0]
    else:
        w = keep[:, p:, None].to(x.dtype)
        feats = (x[:, p:] * w).sum(1) / w.sum(1)
    return model.head(model.fc_norm(feats))
