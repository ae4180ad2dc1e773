"""run_sweep on CUDA: static-shape points replay as CUDA graphs, every point has a GPU time."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from raggedvit.sweep import grid_points, run_sweep
from raggedvit.weights import load_vit

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_cuda_sweep_times_cuda_graphs_and_gpu_time(tmp_path: Path) -> None:
    vit, info = load_vit("deit_tiny_patch16_224", seed=0, model_kwargs={"depth": 4})
    points = grid_points("topk-l2", "keep=0.5 at=2") + grid_points("cls-mass", "mass=0.9 at=2")
    points += grid_points("tome", "r=8")
    result = run_sweep(vit, info, points, device="cuda", batch=8, seconds=0.1, out=tmp_path)
    assert result.settings["dtype"] == "fp16-all" and result.settings["device_name"] == torch.cuda.get_device_name()
    graphs = {p.policy: p.cuda_graph for p in result.points}
    assert graphs == {"none": True, "topk-l2": True, "cls-mass": False, "tome": True}  # cls-mass: data-dependent
    for p in result.points:
        assert p.gpu_ms is not None and 0 < p.gpu_ms < p.latency_ms * 2 and p.img_per_s > 0
    assert "GPU ms" in (tmp_path / "sweep.md").read_text()
    capacity = run_sweep(vit, info, points[1:2], device="cuda", batch=8, seconds=0.1, capacity=True)
    assert all(p.cuda_graph for p in capacity.points)  # the capacity layout: every policy static-shape
