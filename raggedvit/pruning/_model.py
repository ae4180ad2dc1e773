"""What the pruned forwards need from a timm VisionTransformer: the support check, embedding, classifier head.

Shared by the ViT backbone (families/vit.py) and the padded reference of the tests (tests/support/padded.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import Attention, PatchEmbed
from timm.models.vision_transformer import Block, VisionTransformer
from torch import nn

from raggedvit.pruning.backbone import module_dtype
from raggedvit.pruning.map_head import check_map_pool

__all__ = ["POOLS", "check_vit", "embed_tokens", "is_distilled", "classify"]

POOLS = ("token", "avg", "avgmax", "max")  # and "map": timm's AttentionPoolLatent (pruning/map_head.py)


def is_distilled(vit: VisionTransformer) -> bool:
    """True for DeiT's VisionTransformerDistilled (class + distillation token, two heads)."""
    return hasattr(vit, "head_dist") and getattr(vit, "dist_token", None) is not None


def check_vit(vit: torch.nn.Module) -> None:
    """Raise ValueError (one line) unless `vit` is a timm VisionTransformer the pruned forwards can run."""
    if not isinstance(vit, VisionTransformer):
        raise ValueError(f"expected a timm VisionTransformer, got {type(vit).__name__}")
    pool = getattr(vit, "attn_pool", None)
    if pool is not None:
        if vit.global_pool != "map":
            raise ValueError(
                f"attention pooling {type(pool).__name__} (global_pool={vit.global_pool!r}) is not supported; "
                "use 'token', 'avg' or 'map'"
            )
        check_map_pool(pool)
    elif vit.global_pool not in POOLS:
        raise ValueError(f"global_pool {vit.global_pool!r} is not supported; expected one of {', '.join(POOLS)}")
    if is_distilled(vit) and vit.global_pool != "token":
        raise ValueError("distilled ViTs must use global_pool='token'")
    for i, blk in enumerate(vit.blocks):
        if type(blk) is not Block:
            raise ValueError(f"block {i} is {type(blk).__name__}; only timm's pre-norm Block is supported")
        if type(blk.attn) is not Attention:
            raise ValueError(f"block {i} attention is {type(blk.attn).__name__}; only timm's Attention is supported")


def _matmul_patches(pe: nn.Module, images: torch.Tensor) -> bool:
    """True when timm's PatchEmbed cuts non-overlapping patches: its Conv is then one GEMM over patch rows."""
    proj = getattr(pe, "proj", None)
    return (
        type(pe) is PatchEmbed
        and type(proj) is nn.Conv2d
        and tuple(proj.stride) == tuple(proj.kernel_size)
        and tuple(proj.padding) == (0, 0)
        and tuple(proj.dilation) == (1, 1)
        and proj.groups == 1
        and not pe.dynamic_img_pad
        and (pe.flatten or pe.output_fmt.value == "NHWC")
        and images.shape[2] % proj.kernel_size[0] == 0
        and images.shape[3] % proj.kernel_size[1] == 0
    )


def patch_embed(pe: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """timm's patch_embed(images), with non-overlapping patches as Reshape + Transpose + one MatMul.

    images [B, Cin, H, W] -> [B, N, C] (or [B, gh, gw, C] for NHWC output, dynamic_img_size models). The GEMM
    form is what the exported graph runs: cuDNN runs the Conv as an implicit GEMM with NCHW->NHWC copies."""
    images = images.to(module_dtype(pe, images.dtype))
    if not _matmul_patches(pe, images):
        return pe(images)
    proj = pe.proj
    B, cin, H, W = images.shape
    (ph, pw), C = tuple(proj.kernel_size), proj.out_channels
    gh, gw = H // ph, W // pw
    if pe.img_size is not None and pe.strict_img_size and (H, W) != tuple(pe.img_size):
        raise ValueError(f"input size {(H, W)} does not match the model's {tuple(pe.img_size)}")
    rows = images.reshape(B, cin, gh, ph, gw, pw).permute(0, 2, 4, 1, 3, 5).reshape(B, gh * gw, cin * ph * pw)
    x = F.linear(rows, proj.weight.reshape(C, cin * ph * pw), proj.bias)  # [B, N, C]
    if not pe.flatten:  # NHWC
        x = x.reshape(B, gh, gw, C)
    return pe.norm(x)


def embed_tokens(vit: VisionTransformer, images: torch.Tensor) -> torch.Tensor:
    """images [B, 3, S, S] -> tokens [B, N, C] (patch_embed, _pos_embed, patch_drop, norm_pre), N = p + patches."""
    x = patch_embed(vit.patch_embed, images)
    x = vit._pos_embed(x)
    x = vit.patch_drop(x)
    return vit.norm_pre(x)


def classify(vit: VisionTransformer, first: torch.Tensor, second: torch.Tensor | None, pooled: torch.Tensor | None):
    """Classifier head on per-image features, after the final norm.

    Args:
        first: [B, C] row 0 of each image (class token, or first prefix/patch row).
        second: [B, C] row 1 of each image (distillation token) for distilled models, else None.
        pooled: [B, C] pooled features for 'avg'/'avgmax'/'max' pools, else None.

    Returns:
        logits [B, num_classes] (distilled: the eval-mode average of both heads, as timm).
    """
    if is_distilled(vit):
        assert second is not None
        return (vit.head(vit.head_drop(first)) + vit.head_dist(vit.head_drop(second))) / 2
    feats = first if vit.global_pool == "token" else pooled
    assert feats is not None
    return vit.head(vit.head_drop(vit.fc_norm(feats)))
