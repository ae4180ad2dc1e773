"""The timm model families PrunedViT runs, one module per family, and the registry of them: `BACKBONES` lists every
family's Backbone class, `backbone_for` picks the one that runs a model. The family modules import the Backbone
interface (raggedvit.pruning.backbone), which imports no family: no import circle."""

from __future__ import annotations

from torch import nn

from raggedvit.pruning.backbone import Backbone
from raggedvit.pruning.families.beit import BeitBackbone
from raggedvit.pruning.families.cait import CaitBackbone
from raggedvit.pruning.families.eva import EvaBackbone
from raggedvit.pruning.families.relpos import RelPosBackbone
from raggedvit.pruning.families.vit import ViTBackbone

__all__ = ["BACKBONES", "backbone_for", "check_supported", "supported_classes"]

# every family; a new family adds its Backbone class here
BACKBONES: tuple[type[Backbone], ...] = (ViTBackbone, EvaBackbone, BeitBackbone, RelPosBackbone, CaitBackbone)
# "module.QualName" of each timm class a family runs -> its Backbone class
_BY_CLASS = {f"{k.__module__}.{k.__qualname__}": cls for cls in BACKBONES for k in cls.model_classes}


def supported_classes() -> tuple[str, ...]:
    """The timm class names PrunedViT runs (their subclasses run too)."""
    return tuple(sorted({name.rsplit(".", 1)[1] for name in _BY_CLASS}))


def backbone_for(model: nn.Module) -> Backbone:
    """The backbone of a timm model; ValueError (one line) if no family runs it or the family refuses it."""
    for klass in type(model).__mro__:  # subclasses (e.g. VisionTransformerDistilled) run as their base
        cls = _BY_CLASS.get(f"{klass.__module__}.{klass.__qualname__}")
        if cls is not None:
            return cls(model)
    raise ValueError(f"expected a timm {' / '.join(supported_classes())}, got {type(model).__name__}")


def check_supported(model: nn.Module) -> None:
    """Raise ValueError (one line) unless PrunedViT can run `model`."""
    backbone_for(model)
