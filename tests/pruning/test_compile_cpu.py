"""torch.compile of PrunedViT for every policy, on the CPU: dynamo traces the whole forward (fullgraph=True) and
the compiled model gives the eager result. A dynamo failure is not a GPU matter: this shows it in CI, before a GPU
run does (the GPU suite compiles with mode="reduce-overhead" on CUDA: test_capacity_gpu.py)."""

from __future__ import annotations

import pytest
import torch
from _pruning_models import get_images, get_model

from raggedvit.pruning import PrunedViT, PruneSpec
from tests.support.testing import assert_close

SPECS = {
    "topk-l2": (PruneSpec("topk-l2", (1, 2), keep=0.6), False),
    "evit": (PruneSpec("evit", (1, 2), keep=0.6), False),
    "evit-fuse": (PruneSpec("evit", (1, 2), keep=0.6, fuse=True), False),
    "evit-fuse-capacity": (PruneSpec("evit", (1, 2), keep=0.6, fuse=True), True),
    "cls-mass": (PruneSpec("cls-mass", (1, 2), mass=0.8), False),
    "cls-mass-capacity": (PruneSpec("cls-mass", (1, 2), mass=0.8), True),
    "tome": (PruneSpec("tome", r=8), False),
}


@pytest.mark.parametrize("name", list(SPECS))
def test_fullgraph_compile_equals_eager(name: str) -> None:
    spec, capacity = SPECS[name]
    vit = get_model("deit_tiny_d3")
    images = get_images("deit_tiny_d3", ("chelsea", "coffee"))
    model = PrunedViT(vit, spec, capacity=capacity)
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            got = torch.compile(model, fullgraph=True, backend="eager")(images)
            want = model(images)
    finally:
        torch._dynamo.reset()
    assert torch.equal(got.token_counts, want.token_counts)
    assert_close(got.logits, want.logits, rtol=1e-5, atol=1e-5, name=f"{name} compiled logits")
