"""raggedvit: export token-pruned Vision Transformers to ONNX with a ragged attention custom op."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["InputError", "__version__"]


class InputError(ValueError):
    """An input (a file, a model, a grid, images, a setting) cannot be used; the message says which and why. The one
    base of the library's errors about a user's inputs: the CLI maps every InputError to exit code 2 with its one-line
    message (cli/contract.py), whichever command raised it."""
