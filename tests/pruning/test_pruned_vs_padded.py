"""The packed pruned forward equals the padded reference (and timm itself when nothing is pruned)."""

from __future__ import annotations

import pytest
import torch
from _pruning_models import get_images, get_model

from raggedvit.pruning import PrunedViT, PruneSpec
from raggedvit.weights import load_vit
from tests.support.padded import padded_reference_forward
from tests.support.testing import assert_close

SPECS = {
    "none": PruneSpec("none"),
    "topk-l2": PruneSpec("topk-l2", prune_at=(1, 3), keep=0.7),
    "evit": PruneSpec("evit", prune_at=(2,), keep=0.5),
    "evit-fuse": PruneSpec("evit", prune_at=(1, 3), keep=0.6, fuse=True),
    "cls-mass": PruneSpec("cls-mass", prune_at=(1, 2), mass=0.8),
}
CLS_MODELS = ["deit_tiny", "vit_small", "deit_tiny_384", "deit_tiny_distilled", "dinov2_reg4"]
CASES = [(m, s) for m in CLS_MODELS for s in SPECS] + [("wee_reg1_gap", "none"), ("wee_reg1_gap", "topk-l2")]


@pytest.mark.usefixtures("no_grad")
@pytest.mark.parametrize(("model_key", "spec_key"), CASES)
def test_packed_equals_padded(model_key: str, spec_key: str) -> None:
    vit, images, spec = get_model(model_key), get_images(model_key), SPECS[spec_key]
    packed = PrunedViT(vit, spec)(images)
    padded = padded_reference_forward(vit, spec, images)
    assert_close(packed.logits, padded.logits, rtol=1e-5, atol=1e-5, name="logits")
    assert packed.token_counts.dtype == torch.int64
    assert packed.token_counts.shape == (images.shape[0], spec.num_stages)
    assert torch.equal(packed.token_counts, padded.token_counts)
    for a, b in zip(packed.token_index, padded.token_index):
        assert torch.equal(a, b)
    for a, b in zip(packed.cu_seqlens, padded.cu_seqlens):
        assert torch.equal(a, b)
    if spec.policy == "none":
        assert_close(packed.logits, vit(images), rtol=1e-5, atol=1e-5, name="logits vs timm")


@pytest.mark.usefixtures("no_grad")
@pytest.mark.parametrize("spec_key", ["cls-mass", "evit-fuse"])
def test_sdpa_padded_baseline_matches(spec_key: str) -> None:
    vit, images, spec = get_model("deit_tiny_distilled"), get_images("deit_tiny_distilled"), SPECS[spec_key]
    eager = padded_reference_forward(vit, spec, images)
    sdpa = padded_reference_forward(vit, spec, images, attention="sdpa", shrink=False)
    assert_close(sdpa.logits, eager.logits, rtol=1e-5, atol=1e-5, name="sdpa logits")
    assert torch.equal(sdpa.token_counts, eager.token_counts)


@pytest.mark.usefixtures("no_grad")
def test_cls_mass_counts_follow_the_image() -> None:
    """Sharpened seeded weights + real photos: cls-mass keeps a different number of tokens per image."""
    names = ("chelsea", "coffee", "rocket", "astronaut")
    vit, images = get_model("deit_tiny"), get_images("deit_tiny", names)
    out = PrunedViT(vit, PruneSpec("cls-mass", prune_at=(4,), mass=0.9))(images)
    counts = out.token_counts[:, 0]
    assert len(set(counts.tolist())) >= 3, counts.tolist()
    assert bool((counts > 1).all()) and bool((counts <= 197).all())


@pytest.mark.usefixtures("no_grad")
def test_token_counts_semantics() -> None:
    vit, images = get_model("deit_tiny_distilled"), get_images("deit_tiny_distilled")
    B, p, P = images.shape[0], 2, 196
    out = PrunedViT(vit, PruneSpec("topk-l2", prune_at=(1, 3), keep=0.7))(images)
    k1 = -(-7 * P // 10)  # ceil(0.7 * 196) = 138
    k2 = -(-7 * k1 // 10)
    assert out.token_counts.tolist() == [[p + k1, p + k2]] * B
    for s, cu in enumerate(out.cu_seqlens):
        assert torch.equal(cu.diff(), out.token_counts[:, s])
        assert out.token_index[s].shape == (int(cu[-1]),)
        for b in range(B):  # prefix rows first, then patch rows in original order
            rows = out.token_index[s][cu[b] : cu[b + 1]]
            assert rows[:p].tolist() == [0, 1]
            assert bool((rows[p:].diff() > 0).all())


@pytest.mark.usefixtures("no_grad")
def test_evit_fuse_adds_one_token_per_image() -> None:
    vit, images = get_model("deit_tiny"), get_images("deit_tiny")
    plain = PrunedViT(vit, PruneSpec("evit", prune_at=(2,), keep=0.5))(images)
    fused = PrunedViT(vit, PruneSpec("evit", prune_at=(2,), keep=0.5, fuse=True))(images)
    assert torch.equal(fused.token_counts, plain.token_counts + 1)
    cu = fused.cu_seqlens[0]
    idx = fused.token_index[0]
    assert idx[cu[1:] - 1].tolist() == [-1] * images.shape[0]  # fused token is each image's last row
    assert int((idx == -1).sum()) == images.shape[0]


@pytest.mark.usefixtures("no_grad")
@pytest.mark.parametrize(
    "model_kwargs",
    [
        {"global_pool": "avg"},
        {"global_pool": "max"},
        {"global_pool": "avgmax"},
        {"qk_norm": True, "init_values": 0.5},
        {"global_pool": "map", "reg_tokens": 2},  # SigLIP's attention pooling over the patch rows
    ],
    ids=["avg", "max", "avgmax", "qk_norm-layerscale", "map-registers"],
)
def test_block_and_pool_variants(model_kwargs: dict) -> None:
    vit, _ = load_vit("deit_tiny_patch16_224", seed=2, model_kwargs={"depth": 3, **model_kwargs})
    images = get_images("deit_tiny")
    none = PrunedViT(vit, PruneSpec())(images)
    assert_close(none.logits, vit(images), rtol=1e-5, atol=1e-5, name="logits vs timm")
    spec = PruneSpec("topk-l2", prune_at=(1, 2), keep=0.6)
    packed, padded = PrunedViT(vit, spec)(images), padded_reference_forward(vit, spec, images)
    assert_close(packed.logits, padded.logits, rtol=1e-5, atol=1e-5, name="logits")
    assert torch.equal(packed.token_counts, padded.token_counts)


@pytest.mark.usefixtures("no_grad")
def test_map_head_on_ragged_counts() -> None:
    """The MAP head over each image's kept rows when the images keep different counts (cls-mass)."""
    vit, _ = load_vit("deit_tiny_patch16_224", seed=2, model_kwargs={"depth": 3, "global_pool": "map"})
    images = get_images("deit_tiny")
    spec = PruneSpec("cls-mass", prune_at=(1, 2), mass=0.7)
    packed, padded = PrunedViT(vit, spec)(images), padded_reference_forward(vit, spec, images)
    assert torch.equal(packed.token_counts, padded.token_counts)
    assert packed.token_counts[0, 0] != packed.token_counts[1, 0]
    assert_close(packed.logits, padded.logits, rtol=1e-5, atol=1e-5, name="logits")
