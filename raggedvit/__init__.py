"""raggedvit: export token-pruned Vision Transformers to ONNX with a ragged attention custom op."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
