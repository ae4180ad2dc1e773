"""Variant names (no heavy imports: readme_table.py reads results without torch)."""

from __future__ import annotations

__all__ = ["BASELINES", "CUDA_ONLY", "PRUNED", "VARIANTS"]

BASELINES = ("timm_eager_fp16", "ort_fp16", "ort_fp16_optimized")  # unpruned, policy "none"
PRUNED = ("torch_padded_sdpa", "torch_varlen", "torch_raggedvit", "ort_raggedvit")  # one set per pruning policy
VARIANTS = BASELINES + PRUNED
CUDA_ONLY = ("torch_varlen",)  # flash varlen attention has no CPU kernel
