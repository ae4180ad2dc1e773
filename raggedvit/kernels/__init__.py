"""Ragged attention over packed variable-length token sequences."""

from __future__ import annotations

from raggedvit.kernels.ragged_attention import ragged_attention
from raggedvit.kernels.reference import ragged_attention_reference

__all__ = ["ragged_attention", "ragged_attention_reference"]
