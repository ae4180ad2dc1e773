"""Typed errors of the validator (the CLI maps them to exit code 2)."""

from __future__ import annotations

from raggedvit import InputError

__all__ = ["OpLibraryMissing", "ValidationInputError"]


class ValidationInputError(InputError):
    """The model file, its recipe, the checkpoint or the images cannot be used (message says which)."""


class OpLibraryMissing(RuntimeError):
    """The raggedvit ONNX Runtime op library is not built or cannot be loaded."""
