"""The timm model families PrunedViT runs, one module per family; importing this package registers them
(raggedvit.pruning.backbone.register_backbone)."""

from __future__ import annotations

from raggedvit.pruning.families import beit, cait, eva, relpos, vit

__all__ = ["beit", "cait", "eva", "relpos", "vit"]
