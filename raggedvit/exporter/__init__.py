"""Explicit ONNX export of token-pruned timm ViTs with com.raggedvit::RaggedAttention nodes."""

from __future__ import annotations

from raggedvit.exporter.checks import check_graph
from raggedvit.exporter.export import OPSET, build_model, export_onnx
from raggedvit.exporter.metadata import RECIPE_KEY, read_recipe
from raggedvit.exporter.support import UnsupportedModelError, check_supported

__all__ = [
    "OPSET",
    "RECIPE_KEY",
    "UnsupportedModelError",
    "build_model",
    "check_graph",
    "check_supported",
    "export_onnx",
    "read_recipe",
]
