"""Accuracy against speed over a grid of pruning settings (`raggedvit sweep`; DESIGN.md section 7).

from raggedvit.sweep import grid_points, run_sweep
from raggedvit.weights import load_vit

vit, info = load_vit("deit_small_patch16_224", checkpoint="deit_small.safetensors")
points = grid_points("topk-l2", "keep=0.3,0.5,0.7 at=3,6,9|4") + grid_points("cls-mass", "mass=0.8,0.9 at=3,6,9")
result = run_sweep(vit, info, points, device="cuda", batch=32, out="sweep")  # sweep.json / .csv / .md / .png
result.pareto()  # keys of the points no other point beats on both img/s and agreement (top-1 with labels)
"""

from __future__ import annotations

from raggedvit.sweep.grid import SweepInputError, grid_keys, grid_points, parse_grid, point_label
from raggedvit.sweep.report import FILES, PointResult, SweepResult
from raggedvit.sweep.runner import DTYPES, check_out_folder, default_dtype, run_sweep, write_outputs

__all__ = [
    "DTYPES",
    "FILES",
    "PointResult",
    "SweepInputError",
    "SweepResult",
    "check_out_folder",
    "default_dtype",
    "grid_keys",
    "grid_points",
    "parse_grid",
    "point_label",
    "run_sweep",
    "write_outputs",
]
