"""Small seeded timm ViTs (cached per process) and real sample images for the pruning tests."""

from __future__ import annotations

import functools

import torch

from raggedvit.images import preprocess, sample_images
from raggedvit.weights import load_vit

# name -> (timm name, load_vit kwargs). Depth is cut where the full model would be slow on 2 CPU cores; width,
# heads, patch size, resolution and prefix tokens are the real architecture's.
MODELS = {
    "deit_tiny": ("deit_tiny_patch16_224", {}),
    "deit_tiny_d3": ("deit_tiny_patch16_224", {"model_kwargs": {"depth": 3}}),
    "deit_small": ("deit_small_patch16_224", {}),
    "deit_tiny_d4": ("deit_tiny_patch16_224", {"model_kwargs": {"depth": 4}}),
    "vit_small": ("vit_small_patch16_224", {"model_kwargs": {"depth": 6}}),
    "deit_tiny_384": ("deit_tiny_patch16_224", {"img_size": 384, "model_kwargs": {"depth": 4}}),
    "deit_tiny_distilled": ("deit_tiny_distilled_patch16_224", {"model_kwargs": {"depth": 6}}),
    # cls + 4 registers; init_values=1.0 so LayerScale (1e-5 in DINOv2) does not make every block an identity
    "dinov2_reg4": (
        "vit_small_patch14_reg4_dinov2",
        {"img_size": 224, "model_kwargs": {"depth": 4, "init_values": 1.0}},
    ),
    # a class token (cls-mass ranks by it) and mean pooling over the kept rows
    "deit_tiny_avg": ("deit_tiny_patch16_224", {"model_kwargs": {"depth": 4, "global_pool": "avg"}}),
    # no class token, 1 register, avg pool with fc_norm
    "wee_reg1_gap": ("vit_wee_patch16_reg1_gap_256", {"model_kwargs": {"depth": 4}}),
}


@functools.cache
def get_model(key: str) -> torch.nn.Module:
    name, kwargs = MODELS[key]
    model, _ = load_vit(name, seed=0, **kwargs)
    return model


@functools.lru_cache(maxsize=1)
def _images():
    return sample_images()


@functools.cache
def get_images(key: str, names: tuple[str, ...] = ("chelsea", "rocket")) -> torch.Tensor:
    """[B, 3, S, S] float32 sample images preprocessed for model `key`."""
    pool = dict(_images())
    return preprocess([pool[n] for n in names], get_model(key))
