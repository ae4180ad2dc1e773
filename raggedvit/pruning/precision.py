"""Export dtype recipes, as the dtypes of a ViT's submodules (DESIGN.md section 5).

The pruned forward casts each submodule's input to that submodule's dtype (`module_dtype`), so one forward
runs every recipe; the exporter traces the recipe's copy of the model and the casts become ONNX Cast nodes.

- ``fp32``: everything float32.
- ``fp16``: the block GEMMs, attention and MLP (and q/k norms) in float16; the residual stream, its LayerNorms
  and LayerScales, the patch embedding, the pruning scores and the head in float32.
- ``fp16-all``: whole blocks in float16 (residual stream and its LayerNorms too: no Cast inside a block); the
  embedding (cast once into the stream), the scores and the head stay float32.
"""

from __future__ import annotations

import copy

from torch import nn

__all__ = ["DTYPES", "apply_dtype"]

DTYPES = ("fp32", "fp16", "fp16-all")


def apply_dtype(vit: nn.Module, dtype: str) -> nn.Module:
    """A copy of `vit` (float32) with the submodule dtypes of the export recipe `dtype` (`vit` itself for fp32)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if dtype == "fp32":
        return vit
    from raggedvit.pruning.families import backbone_for

    out = copy.deepcopy(vit).float()
    for module in backbone_for(out).half_modules(dtype):
        module.half()
    return out.eval()
