"""Per-block validation of clean exports of other model families (2 blocks each, small images): no false
failures, and every block's drift is measured against its floor."""

from __future__ import annotations

import pytest

from raggedvit.coverage.model import reduced_model
from raggedvit.exporter import export_onnx
from raggedvit.images import preprocess, sample_images
from raggedvit.pruning import PruneSpec
from raggedvit.validators import validate

pytestmark = pytest.mark.slow  # seconds a test: scheduled first (tests/conftest.py)

FAMILIES = [
    "eva02_tiny_patch14_224",  # EVA02: RoPE, SwiGLU
    "beit_base_patch16_224",  # BEiT: relative position bias
    "vit_relpos_base_patch16_224",  # RelPos
    "cait_xxs24_224",  # CaiT: class-attention blocks in the head
    "vit_base_patch16_siglip_224",  # SigLIP: attention-pooling (MAP) head
    "vit_base_patch16_clip_224",  # CLIP: pre-norm
]


@pytest.mark.parametrize("name", FAMILIES)
def test_clean_family_export_passes_per_block(name, tmp_path):
    vit, _ = reduced_model(name, depth=2, img_size=64)
    vit = vit.float().eval()
    spec = PruneSpec("topk-l2", (1,), keep=0.5)
    path = export_onnx(vit, spec, tmp_path / "m.onnx", recipe={"model": name})
    pairs = sample_images()[:2]
    from raggedvit.validators import load_recipe

    recipe = load_recipe(path)
    report = validate(path, preprocess(pairs, vit), [n for n, _ in pairs], vit=vit, spec=spec, recipe=recipe)
    assert report.passed, report.to_markdown()
    table = report.block_table()
    assert len(table) == 2 and all(t["drift"] is not None and t["floor"] for t in table), report.to_markdown()
    assert "| block | max drift | fp32 floor | ratio |" in report.to_markdown()
