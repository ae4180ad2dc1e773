"""Tiny timm Eva models (depth 2, 32x32 images) covering the family's variants, with seeded weights."""

from __future__ import annotations

import functools
from typing import Any

import torch
from timm.layers import RmsNorm
from timm.models.eva import Eva
from torch import nn

from raggedvit.weights import perturb_biases_and_norms_, sharpen_qk_

BASE: dict[str, Any] = {"img_size": 32, "patch_size": 8, "embed_dim": 64, "depth": 2, "num_heads": 4, "num_classes": 10}
ROPE_ATTN: dict[str, Any] = {"attn_type": "rope", "qkv_bias": False, "use_abs_pos_emb": False, "use_rot_pos_emb": True}

# name -> Eva kwargs; each names the registered timm models it stands for
VARIANTS: dict[str, dict[str, Any]] = {
    # eva02_tiny / small: fused qkv with q/v bias, axial rope, GluMlp (SwiGLU packed), avg pool + fc_norm
    "eva02": {"use_rot_pos_emb": True, "swiglu_mlp": True, "ref_feat_shape": 4},
    # eva02_*_clip: separate q/k/v, sub-LN in attention and SwiGLU (scale norms), token pool
    "eva02_clip": {
        "use_rot_pos_emb": True,
        "qkv_fused": False,
        "swiglu_mlp": True,
        "scale_mlp": True,
        "scale_attn_inner": True,
        "global_pool": "token",
    },
    # eva02_enormous: post-norm blocks, no rope (the qkv bias rides into the op)
    "post_norm": {"use_post_norm": True, "global_pool": "token"},
    # vit_*_rope_mixed_*: per-block per-head learnable rope, AttentionRope, LayerScale
    "rope_mixed": {**ROPE_ATTN, "rope_type": "mixed", "init_values": 0.5, "global_pool": "token"},
    # vit_*_dinov3: DINOv3 rope (rotate-half layout), 4 registers, dynamic-size NHWC patch embedding, avgmax pool
    "dinov3": {
        "use_abs_pos_emb": False,
        "use_rot_pos_emb": True,
        "rope_type": "dinov3",
        "rope_rotate_half": True,
        "num_reg_tokens": 4,
        "dynamic_img_size": True,
        "init_values": 0.5,
        "global_pool": "avgmax",
    },
    # vit_*_sapiens2: grouped k/v heads, qk norm, RmsNorm, LayerScale on attention only, registers
    "sapiens2": {
        **ROPE_ATTN,
        "qkv_fused": False,
        "num_kv_heads": 2,
        "qk_norm": True,
        "norm_layer": RmsNorm,
        "rope_type": "dinov3",
        "rope_rotate_half": True,
        "num_reg_tokens": 2,
        "init_values": 0.5,
        "attn_only_layer_scale": True,
        "swiglu_mlp": True,
        "global_pool": "token",
    },
    # vit_*_rope_reg1_gap_256: no class token, one register, avg pool; plus EvaAttention's sigmoid output gate
    # (an EvaBlock option no registered model sets: added after the build)
    "reg1_gap_gated": {"use_rot_pos_emb": True, "class_token": False, "num_reg_tokens": 1},
}


@functools.cache
def eva_model(name: str) -> Eva:
    """The seeded Eva of VARIANTS[name] (eval mode): random biases / norms / gammas, q and k rows x4."""
    torch.manual_seed(0)
    model = Eva(**{**BASE, **VARIANTS[name]})
    if name == "reg1_gap_gated":
        for blk in model.blocks:
            blk.attn.gate = nn.Linear(BASE["embed_dim"], BASE["embed_dim"])
    with torch.no_grad():
        model.head.weight.normal_(0.0, 0.3)  # timm's head init (x0.001) would leave tiny logits
    perturb_biases_and_norms_(model, seed=0)
    sharpen_qk_(model, 4.0)
    return model.eval()


def eva_images(name: str, batch: int = 2) -> torch.Tensor:
    h, w = eva_model(name).patch_embed.img_size
    return torch.randn(batch, 3, h, w, generator=torch.Generator().manual_seed(1))
