"""Validate an exported model: ONNX Runtime vs the PyTorch reference, with JSON and Markdown reports."""

from __future__ import annotations

from raggedvit.validators.errors import OpLibraryMissing, ValidationInputError
from raggedvit.validators.reference import load_recipe, load_reference
from raggedvit.validators.report import Failure, ImageRow, NearTie, Thresholds, ValidationReport
from raggedvit.validators.session import open_session
from raggedvit.validators.ties import cut_gaps, find_near_ties
from raggedvit.validators.validate import run_onnx, run_reference, validate

__all__ = [
    "Failure",
    "ImageRow",
    "NearTie",
    "OpLibraryMissing",
    "Thresholds",
    "ValidationInputError",
    "ValidationReport",
    "cut_gaps",
    "find_near_ties",
    "load_recipe",
    "load_reference",
    "open_session",
    "run_onnx",
    "run_reference",
    "validate",
]
