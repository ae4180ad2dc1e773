"""ONNX export of token-pruned timm ViTs by tracing PrunedViT, with com.raggedvit::RaggedAttention nodes.

Names are imported lazily (PEP 562): reading a recipe or checking a graph does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "check_graph": "checks",
    "OPSET": "export",
    "build_model": "export",
    "export_onnx": "export",
    "output_names": "naming",
    "save_model": "saving",
    "RECIPE_KEY": "metadata",
    "read_recipe": "metadata",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'raggedvit.exporter' has no attribute {name!r}")
    return getattr(importlib.import_module(f"raggedvit.exporter.{_EXPORTS[name]}"), name)
