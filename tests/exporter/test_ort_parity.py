"""ORT CPU EP (with the op library) vs the torch packed model (PrunedViT), fp32, real sample images."""

from __future__ import annotations

import pytest
from torch import nn

from raggedvit.exporter import build_model, save_model
from raggedvit.pruning import PruneSpec
from raggedvit.weights import load_vit, perturb_biases_and_norms_

from ._pruned import diff_to_pruned

pytestmark = pytest.mark.slow  # seconds a test: scheduled first (tests/conftest.py)

SPECS = [
    PruneSpec(),
    PruneSpec("topk-l2", (4,)),
    PruneSpec("topk-l2", (3, 6, 9), keep=0.7),
    PruneSpec("cls-mass", (4,)),
    PruneSpec("cls-mass", (3, 6, 9), mass=0.8),
    PruneSpec("evit", (4,)),
    PruneSpec("evit", (3, 6, 9), keep=0.6),
    PruneSpec("evit", (4,), fuse=True),
    PruneSpec("evit", (3, 6, 9), keep=0.7, fuse=True),
]


def _ids(s: PruneSpec) -> str:
    return f"{s.policy}-{','.join(map(str, s.prune_at)) or 'x'}{'-fuse' if s.fuse else ''}"


def _compare(session, vit, spec, images, atol=1e-4):
    logits, counts = session.run(["logits", "token_counts"], {"images": images.numpy()})
    diff, _ = diff_to_pruned(logits, counts, vit, spec, images)
    assert diff < atol


@pytest.mark.parametrize("spec", SPECS, ids=_ids)
def test_deit_tiny_matches_torch(deit_tiny, images, ort_session, spec):
    session = ort_session(build_model(deit_tiny, spec))
    _compare(session, deit_tiny, spec, images)


def test_policy_none_equals_timm(deit_tiny, images, ort_session):
    import torch

    logits, _ = ort_session(build_model(deit_tiny, PruneSpec())).run(None, {"images": images.numpy()})
    with torch.no_grad():
        ref = deit_tiny(images).numpy()
    assert abs(logits - ref).max() < 1e-4 * max(1.0, abs(ref).max())


def test_dynamic_batch_same_file(deit_tiny, images, ort_session, tmp_path):
    spec = PruneSpec("cls-mass", (3, 6, 9))
    path = tmp_path / "m.onnx"
    save_model(build_model(deit_tiny, spec), path)
    session = ort_session(str(path))
    for batch in (1, 5):
        _compare(session, deit_tiny, spec, images[:batch])


@pytest.mark.parametrize(
    "name,kwargs,spec",
    [
        ("deit_tiny_distilled_patch16_224", {"depth": 4}, PruneSpec("evit", (2,), fuse=True)),
        (
            "vit_small_patch16_224",
            {"depth": 3, "reg_tokens": 2, "global_pool": "avg", "no_embed_class": True, "init_values": 0.1},
            PruneSpec("topk-l2", (1, 2)),
        ),
        # patch 32; a patch-embedding norm (the projection bias goes before it, not into pos_embed)
        ("vit_small_patch32_224", {"depth": 3, "embed_norm_layer": nn.LayerNorm}, PruneSpec("cls-mass", (1,))),
        # CLIP style: no projection bias, norm_pre
        ("vit_small_patch32_224", {"depth": 3, "pre_norm": True}, PruneSpec("topk-l2", (2,))),
        # SigLIP's MAP head over each image's kept patch rows (ragged counts; cls + registers skipped)
        ("vit_small_patch32_224", {"depth": 3, "global_pool": "map", "reg_tokens": 2}, PruneSpec("cls-mass", (1,))),
    ],
    ids=["distilled", "registers-avgpool-layerscale", "patch32-embed-norm", "patch32-pre-norm-no-bias", "map-head"],
)
def test_other_vit_variants(images, ort_session, name, kwargs, spec):
    vit, _ = load_vit(name, seed=1, model_kwargs=kwargs)
    _compare(ort_session(build_model(vit, spec)), vit, spec, images[:3])


@pytest.mark.parametrize(
    "name,kwargs,spec",
    [
        ("deit_tiny_patch16_224", {"depth": 6}, PruneSpec("topk-l2", (2,))),
        ("deit_tiny_patch16_224", {"depth": 6}, PruneSpec("cls-mass", (2, 4))),
        ("deit_tiny_distilled_patch16_224", {"depth": 4}, PruneSpec("evit", (2,), fuse=True)),
        (
            "vit_small_patch16_224",
            {"depth": 3, "reg_tokens": 2, "global_pool": "avg", "no_embed_class": True, "init_values": 0.1},
            PruneSpec("topk-l2", (1, 2)),
        ),
        ("vit_small_patch32_224", {"depth": 3, "embed_norm_layer": nn.LayerNorm}, PruneSpec("cls-mass", (1,))),
    ],
    ids=["topk", "cls-mass", "distilled-evit-fuse", "registers-avgpool-layerscale", "patch32-embed-norm"],
)
def test_nonzero_biases_and_norm_shifts(images, ort_session, name, kwargs, spec):
    vit, _ = load_vit(name, seed=1, model_kwargs=kwargs)
    perturb_biases_and_norms_(vit)
    assert float(vit.blocks[0].attn.qkv.bias.detach().abs().max()) > 0.05
    _compare(ort_session(build_model(vit, spec)), vit, spec, images[:3])


@pytest.mark.parametrize("dtype", ["fp16", "fp16-all"])
def test_fp16_exports_with_nonzero_biases(images, ort_session, dtype):
    """The fp16 recipes' bias paths (RaggedAttention bias, BiasGelu, SkipLayerNormalization) against the fp32
    reference: fp16 rounding moves deit_tiny's logits by ~1e-3; a dropped or misplaced bias by far more."""
    vit, _ = load_vit("deit_tiny_patch16_224", seed=1, model_kwargs={"depth": 6})
    perturb_biases_and_norms_(vit)
    spec = PruneSpec("topk-l2", (2, 4))
    logits, counts = ort_session(build_model(vit, spec, dtype=dtype)).run(None, {"images": images[:3].numpy()})
    diff, scale = diff_to_pruned(logits, counts, vit, spec, images[:3])
    assert diff < 1e-2 * max(scale, 1.0)
