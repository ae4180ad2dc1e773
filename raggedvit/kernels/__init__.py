"""Ragged attention over packed variable-length token sequences and the ragged (live-rows-only) linear layer."""

from __future__ import annotations

from raggedvit.kernels.ragged_attention import ragged_attention
from raggedvit.kernels.ragged_linear import ragged_linear
from raggedvit.kernels.reference import ragged_attention_reference, ragged_linear_reference

__all__ = [
    "ragged_attention",
    "ragged_attention_reference",
    "ragged_linear",
    "ragged_linear_reference",
]
