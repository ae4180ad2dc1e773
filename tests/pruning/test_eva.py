"""EvaBackbone: PrunedViT on timm's Eva family equals timm's forward (policy none), keeps each kept token's
original position (a pruned forward equals timm's own blocks run on the same kept tokens), and refuses what it
cannot run with one-line errors."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from _eva_models import BASE, VARIANTS, eva_images, eva_model
from timm.models.eva import Eva

from raggedvit.pruning import PrunedViT, PruneSpec
from raggedvit.pruning.families import backbone_for

RTOL = 1e-4  # max |Δ| relative to max |reference|, fp32


def _assert_rel(got: torch.Tensor, ref: torch.Tensor) -> None:
    assert got.shape == ref.shape
    diff, scale = float((got - ref).abs().max()), float(ref.abs().max())
    assert diff <= RTOL * scale, f"max |Δ| {diff:.3g} > {RTOL:g} x {scale:.3g}"


def _kept_timm(model: Eva, image: torch.Tensor, stages: dict[int, torch.Tensor]) -> torch.Tensor:
    """timm's own modules on one image [1, 3, H, W], keeping at block i only the original tokens stages[i]
    (ascending, prefix included): the rope rows of the kept patches are cut from timm's table by their original
    index, then timm's blocks and head run as they are. -> logits [1, classes]."""
    p = model.num_prefix_tokens
    x, table = model._pos_embed(model.patch_embed(image))  # table: every patch's rope row
    x = model.norm_pre(x)
    rope = table
    index = torch.arange(x.shape[1])  # original token index of each current row
    for i, blk in enumerate(model.blocks):
        if i in stages:
            keep = stages[i]
            x = x[:, (index.unsqueeze(0) == keep.unsqueeze(1)).int().argmax(dim=1)]
            if table is not None:
                rope = table.index_select(-2, keep[keep >= p] - p)
            index = keep
        x = blk(x, rope=None if rope is None else (rope[i] if model.rope_mixed else rope))
    return model.forward_head(model.norm(x))


@pytest.mark.parametrize("name", list(VARIANTS))
def test_policy_none_equals_timm(name: str, no_grad) -> None:
    model, x = eva_model(name), eva_images(name)
    out = PrunedViT(model, PruneSpec("none"))(x)
    _assert_rel(out.logits, model(x))


@pytest.mark.parametrize(
    "name,policy",
    [
        (n, p)
        for n in VARIANTS
        for p in ("topk-l2", "cls-mass")
        if p == "topk-l2" or VARIANTS[n].get("class_token", True)
    ],
)
def test_pruned_forward_keeps_original_positions(name: str, policy: str, no_grad) -> None:
    """Each image of a pruned packed batch equals timm's blocks on that image's kept tokens, with their rope
    rows: the packed rope follows token_index, never the packed row."""
    model, x = eva_model(name), eva_images(name)
    spec = PruneSpec(policy, (1,), keep=0.5, mass=0.7)
    out = PrunedViT(model, spec)(x)
    (token_index,), (cu,) = out.token_index, out.cu_seqlens
    tokens = backbone_for(model).tokens_per_image()
    for b in range(x.shape[0]):
        kept = token_index[cu[b] : cu[b + 1]]
        assert bool((kept[1:] > kept[:-1]).all()) and int(kept.max()) < tokens
        assert kept.numel() < tokens  # the stage dropped tokens
        _assert_rel(out.logits[b : b + 1], _kept_timm(model, x[b : b + 1], {1: kept}))


def test_two_stages_and_mixed_rope_per_block(no_grad) -> None:
    """Depth 3, stages at blocks 1 and 2: mixed rope reads block i's own table at each kept token."""
    torch.manual_seed(0)
    model = Eva(**{**BASE, **VARIANTS["rope_mixed"], "depth": 3}).eval()
    with torch.no_grad():
        model.head.weight.normal_(0.0, 0.3)
    x = eva_images("rope_mixed")
    out = PrunedViT(model, PruneSpec("topk-l2", (1, 2), keep=0.6))(x)
    for b in range(x.shape[0]):
        stages = {i + 1: ti[cu[b] : cu[b + 1]] for i, (ti, cu) in enumerate(zip(out.token_index, out.cu_seqlens))}
        _assert_rel(out.logits[b : b + 1], _kept_timm(model, x[b : b + 1], stages))


def test_evit_fuse_runs_and_leaves_the_fused_row_unrotated(no_grad) -> None:
    model, x = eva_model("eva02"), eva_images("eva02")
    out = PrunedViT(model, PruneSpec("evit", (1,), keep=0.5, fuse=True))(x)
    (token_index,) = out.token_index
    assert int((token_index == -1).sum()) == x.shape[0] and torch.isfinite(out.logits).all()


def test_backbone_attributes() -> None:
    bb = backbone_for(eva_model("dinov3"))
    assert (bb.num_prefix, bb.has_class_token, bb.depth, bb.tokens_per_image()) == (5, True, 2, 16 + 5)
    bb = backbone_for(eva_model("reg1_gap_gated"))
    assert (bb.num_prefix, bb.has_class_token) == (1, False)


@pytest.mark.parametrize("policy", ["evit", "cls-mass"])
def test_class_token_policies_refused_without_class_token(policy: str) -> None:
    with pytest.raises(ValueError, match="needs a class token") as info:
        PrunedViT(eva_model("reg1_gap_gated"), PruneSpec(policy, (1,)))
    assert "\n" not in str(info.value)


def test_unpooled_model_refused() -> None:
    model = Eva(**{**BASE, "global_pool": ""})
    with pytest.raises(ValueError, match=r"global_pool '' is not supported; expected one of token, avg") as info:
        PrunedViT(model, PruneSpec())
    assert "\n" not in str(info.value)


def test_attention_pool(no_grad) -> None:
    """'map' (Perception Encoder core): refused in one line without raggedvit.pruning.map_head, else equal to
    timm (every row pooled, prefix included)."""
    torch.manual_seed(0)
    model = Eva(**{**BASE, **VARIANTS["eva02"], "global_pool": "map"}).eval()
    x = eva_images("eva02")
    if importlib.util.find_spec("raggedvit.pruning.map_head") is None:
        with pytest.raises(ValueError, match=r"global_pool='map'\) needs raggedvit\.pruning\.map_head") as info:
            PrunedViT(model, PruneSpec())
        assert "\n" not in str(info.value)
    else:
        _assert_rel(PrunedViT(model, PruneSpec())(x).logits, model(x))


def test_unsupported_rope_refused() -> None:
    model = Eva(**{**BASE, "use_rot_pos_emb": True, "rope_type": "mrope"})  # no registered model uses MRoPE
    with pytest.raises(ValueError, match="rope RotaryEmbeddingMRope is not supported; expected one of") as info:
        PrunedViT(model, PruneSpec())
    assert "\n" not in str(info.value)
