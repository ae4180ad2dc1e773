"""Variant names (no heavy imports: readme_table.py reads results without torch)."""

from __future__ import annotations

__all__ = ["BASELINES", "CUDA_ONLY", "GRAPH", "ISSUE_BASELINES", "OURS", "PRUNED", "VARIANTS"]

ISSUE_BASELINES = ("timm_eager_fp16", "ort_fp16", "ort_fp16_optimized")  # the unpruned speed bar
# + the optimized unpruned graph replayed as a CUDA graph: not in the bar, measured as the fair peer of
# ort_raggedvit_graph (both without per-node host cost)
BASELINES = (*ISSUE_BASELINES, "ort_fp16_optimized_graph")  # unpruned, policy "none"
PRUNED = ("torch_padded_sdpa", "torch_varlen", "torch_raggedvit", "ort_raggedvit", "ort_raggedvit_graph")
OURS = ("ort_raggedvit", "ort_raggedvit_graph")  # raggedvit exports in ORT: per-node runs, CUDA-graph replay
VARIANTS = BASELINES + PRUNED
GRAPH = ("ort_fp16_optimized_graph", "ort_raggedvit_graph")  # ORT CUDA-graph replay, one session per batch
CUDA_ONLY = ("torch_varlen", *GRAPH)  # flash varlen attention has no CPU kernel; CUDA graphs need CUDA
