"""Eva exports on ONNX Runtime's CPU EP: policy none equals timm, pruning policies equal PrunedViT (token counts
too), for the variants the coverage representatives (tests/test_coverage.py) do not reach; fp16 recipes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _eva_models import eva_images, eva_model

from raggedvit.exporter import export_onnx
from raggedvit.pruning import PrunedViT, PruneSpec
from raggedvit.runtime import create_session

CASES = [
    ("post_norm", PruneSpec("evit", (1,), keep=0.5, fuse=True)),  # qkv bias into the op, post-norm
    ("eva02_clip", PruneSpec("cls-mass", (1,), mass=0.7)),  # separate q/k/v, sub-LN, rope
    ("sapiens2", PruneSpec("topk-l2", (1,), keep=0.5)),  # grouped k/v, qk norm, RmsNorm, registers
    ("reg1_gap_gated", PruneSpec("topk-l2", (1,), keep=0.4)),  # no class token, gate
]


def _rel(got: np.ndarray, ref: torch.Tensor) -> float:
    return float(np.abs(got - ref.numpy()).max()) / max(float(ref.abs().max()), 1e-30)


@pytest.mark.parametrize("name,spec", CASES, ids=[c[0] for c in CASES])
def test_export_matches_pruned_vit(name: str, spec: PruneSpec, tmp_path) -> None:
    model, x = eva_model(name), eva_images(name)
    session = create_session(export_onnx(model, spec, tmp_path / "m.onnx"))
    logits, counts = session.run(None, {"images": x.numpy()})
    with torch.no_grad():
        ref = PrunedViT(model, spec)(x)
    np.testing.assert_array_equal(counts, ref.token_counts.numpy())
    assert _rel(logits, ref.logits) <= 1e-4


def test_export_none_equals_timm(tmp_path) -> None:
    model, x = eva_model("sapiens2"), eva_images("sapiens2")
    session = create_session(export_onnx(model, PruneSpec("none"), tmp_path / "m.onnx"))
    logits = session.run(None, {"images": x.numpy()})[0]
    with torch.no_grad():
        assert _rel(logits, model(x)) <= 1e-4


@pytest.mark.parametrize("dtype", ["fp16", "fp16-all"])
def test_fp16_recipes_on_ort_cpu(dtype: str, tmp_path) -> None:
    """Rope in the half recipes: float32 angles, the rotation cast back to float16 (as timm); logits within fp16
    rounding of the fp32 PrunedViT, token counts equal."""
    model, x = eva_model("eva02"), eva_images("eva02")
    spec = PruneSpec("topk-l2", (1,), keep=0.5)
    logits, counts = create_session(export_onnx(model, spec, tmp_path / "m.onnx", dtype=dtype)).run(
        None, {"images": x.numpy()}
    )
    with torch.no_grad():
        ref = PrunedViT(model, spec)(x)
    np.testing.assert_array_equal(counts, ref.token_counts.numpy())
    assert _rel(logits, ref.logits) <= 2e-2
