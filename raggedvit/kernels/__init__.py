"""Ragged attention over packed variable-length token sequences, the ragged (live-rows-only) linear layer, and
the whole-block op (one pre-norm ViT block on packed rows)."""

from __future__ import annotations

from raggedvit.kernels.ragged_attention import ragged_attention
from raggedvit.kernels.ragged_linear import ragged_linear
from raggedvit.kernels.reference import (
    BlockWeights,
    ragged_attention_reference,
    ragged_linear_reference,
    vit_block_reference,
)
from raggedvit.kernels.vit_block import vit_block

__all__ = [
    "BlockWeights",
    "ragged_attention",
    "ragged_attention_reference",
    "ragged_linear",
    "ragged_linear_reference",
    "vit_block",
    "vit_block_reference",
]
