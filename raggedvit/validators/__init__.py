"""Validate an exported model: ONNX Runtime vs the PyTorch reference, with JSON and Markdown reports.

Names are imported lazily (PEP 562) so that input checks (recipe, op library) run without importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "BlockReference": "blocks",
    "block_reference": "blocks",
    "OpLibraryMissing": "errors",
    "ValidationInputError": "errors",
    "FLOOR_DTYPES": "floor",
    "PrecisionFloor": "floor",
    "precision_floor": "floor",
    "load_recipe": "reference",
    "load_reference": "reference",
    "Failure": "report",
    "ImageRow": "report",
    "NearTie": "report",
    "FP16_ULP": "rules",
    "LOGIT_TOLERANCES": "rules",
    "PRECISION_TIE_ULPS": "rules",
    "Thresholds": "rules",
    "precision_tie_eps": "rules",
    "StructureReport": "structure",
    "check_structure": "structure",
    "ValidationReport": "report",
    "open_session": "session",
    "cut_gaps": "ties",
    "find_near_ties": "ties",
    "first_moved_stage": "ties",
    "precision_tie": "ties",
    "precision_swap": "ties",
    "token_swaps": "ties",
    "run_onnx": "compare",
    "run_reference": "reference",
    "validate": "compare",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'raggedvit.validators' has no attribute {name!r}")
    return getattr(importlib.import_module(f"raggedvit.validators.{_EXPORTS[name]}"), name)
