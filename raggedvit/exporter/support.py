"""Which timm Vision Transformers the explicit exporter can express, checked up front."""

from __future__ import annotations

from torch import nn

__all__ = ["UnsupportedModelError", "check_supported", "prefix_tokens", "tokens_per_image"]


class UnsupportedModelError(ValueError):
    """The model uses a feature the exporter does not translate (the message names it)."""


def _is_identity(m: nn.Module | None) -> bool:
    return m is None or isinstance(m, nn.Identity)


def prefix_tokens(vit: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The prefix token parameters in timm's concatenation order: cls, dist (DeiT), registers."""
    out = []
    for attr in ("cls_token", "dist_token", "reg_token"):
        p = getattr(vit, attr, None)
        if p is not None:
            out.append((attr, p))
    return out


def tokens_per_image(vit: nn.Module) -> int:
    """Tokens per image entering block 0: patches + prefix tokens."""
    return int(vit.patch_embed.num_patches) + int(vit.num_prefix_tokens)


def check_supported(vit: nn.Module) -> None:
    """Raise UnsupportedModelError unless `vit` is a plain timm ViT (or DeiT distilled) we can export."""
    name = type(vit).__name__
    for attr in ("patch_embed", "blocks", "pos_embed", "norm", "head", "num_prefix_tokens"):
        if not hasattr(vit, attr):
            raise UnsupportedModelError(f"{name} is not a timm VisionTransformer (no '{attr}')")
    if getattr(vit, "dynamic_img_size", False):
        raise UnsupportedModelError("dynamic_img_size=True is not supported; export with a fixed --img-size")
    if getattr(vit, "attn_pool", None) is not None:
        raise UnsupportedModelError("attention pooling heads (global_pool='map') are not supported")
    pool = getattr(vit, "global_pool", "token")
    if pool not in ("token", "avg"):
        raise UnsupportedModelError(f"global_pool='{pool}' is not supported (token or avg)")
    if pool == "token" and getattr(vit, "cls_token", None) is None:
        raise UnsupportedModelError("token pooling without a cls token is not supported")
    if vit.pos_embed is None:
        raise UnsupportedModelError("models without an absolute position embedding are not supported")
    if getattr(vit, "rope", None) is not None:
        raise UnsupportedModelError("rotary position embeddings are not supported")
    pe = vit.patch_embed
    proj = getattr(pe, "proj", None)
    if not isinstance(proj, nn.Conv2d) or tuple(proj.padding) != (0, 0) or proj.groups != 1:
        raise UnsupportedModelError("patch embedding must be an unpadded Conv2d")
    img, patch = tuple(pe.img_size), tuple(pe.patch_size)
    if any(i % q for i, q in zip(img, patch)):
        raise UnsupportedModelError(f"image size {img} is not a multiple of the patch size {patch}")
    if getattr(pe, "dynamic_img_pad", False) or getattr(pe, "dynamic_img_size", False):
        raise UnsupportedModelError("dynamic patch padding is not supported")
    for i, blk in enumerate(vit.blocks):
        where = f"block {i}"
        if type(blk).__name__ != "Block":
            raise UnsupportedModelError(f"{where}: block type {type(blk).__name__} is not supported (timm Block only)")
        attn = blk.attn
        if type(attn).__name__ != "Attention":
            raise UnsupportedModelError(f"{where}: attention type {type(attn).__name__} is not supported")
        for sub in ("q_norm", "k_norm", "norm"):
            if not _is_identity(getattr(attn, sub, None)):
                raise UnsupportedModelError(f"{where}: attn.{sub} (qk/scale norm) is not supported")
        if getattr(attn, "gate", None) is not None:
            raise UnsupportedModelError(f"{where}: gated attention is not supported")
        for sub in ("norm1", "norm2"):
            if not isinstance(getattr(blk, sub), nn.LayerNorm):
                raise UnsupportedModelError(f"{where}: {sub} must be LayerNorm, got {type(getattr(blk, sub)).__name__}")
        mlp = blk.mlp
        if type(mlp).__name__ != "Mlp" or not isinstance(mlp.fc1, nn.Linear) or not isinstance(mlp.fc2, nn.Linear):
            raise UnsupportedModelError(f"{where}: MLP type {type(mlp).__name__} is not supported (timm Mlp only)")
        act = mlp.act
        if not isinstance(act, nn.GELU) or act.approximate != "none":
            raise UnsupportedModelError(f"{where}: activation {act} is not supported (exact GELU only)")
        if not (_is_identity(mlp.norm) or isinstance(mlp.norm, nn.LayerNorm)):
            raise UnsupportedModelError(f"{where}: mlp.norm {type(mlp.norm).__name__} is not supported")
        for sub in ("ls1", "ls2"):
            m = getattr(blk, sub)
            if not (_is_identity(m) or hasattr(m, "gamma")):
                raise UnsupportedModelError(f"{where}: {sub} {type(m).__name__} is not supported")
    for sub in ("norm", "fc_norm", "norm_pre"):
        m = getattr(vit, sub, None)
        if not (_is_identity(m) or isinstance(m, nn.LayerNorm)):
            raise UnsupportedModelError(f"{sub} must be LayerNorm or Identity, got {type(m).__name__}")
    if not isinstance(vit.head, nn.Linear):
        raise UnsupportedModelError("a classifier head (num_classes > 0) is required")
