"""CaiT through the exporter on ORT's CPU EP beyond the coverage representative (tests/test_coverage.py: token
pool, fp32): avg pooling in fp32 equals PrunedViT (counts included); the fp16 recipes (the class-attention tail in
half too) stay within fp16 rounding of it."""

from __future__ import annotations

import functools

import pytest
import torch

from raggedvit.coverage.model import reduced_model
from raggedvit.exporter import build_model
from raggedvit.pruning import PruneSpec

from ._pruned import diff_to_pruned

pytestmark = pytest.mark.slow  # seconds a test: scheduled first (tests/conftest.py)

IMG = 64


@functools.cache
def _model(name: str, **kwargs: str):
    model, _ = reduced_model(name, depth=3, img_size=IMG, kwargs=kwargs)
    return model


def _images() -> torch.Tensor:
    return torch.randn(3, 3, IMG, IMG, generator=torch.Generator().manual_seed(1))


def test_avg_pool_fp32_export_equals_pruned(ort_session):
    vit, x, spec = _model("cait_xxs24_224", global_pool="avg"), _images(), PruneSpec("topk-l2", (2,), keep=0.4)
    logits, counts = ort_session(build_model(vit, spec)).run(None, {"images": x.numpy()})
    diff, scale = diff_to_pruned(logits, counts, vit, spec, x)
    assert diff <= 1e-4 * scale


@pytest.mark.parametrize("dtype", ["fp16", "fp16-all"])
def test_fp16_recipes(ort_session, dtype):
    vit, x, spec = _model("cait_xxs24_224"), _images(), PruneSpec("topk-l2", (1, 2), keep=0.6)
    logits, counts = ort_session(build_model(vit, spec, dtype=dtype)).run(None, {"images": x.numpy()})
    diff, scale = diff_to_pruned(logits, counts, vit, spec, x)
    assert diff < 2e-2 * scale
