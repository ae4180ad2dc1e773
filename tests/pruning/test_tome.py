"""Policy tome (token merging) in PrunedViT against an independent reference written from the ToMe paper."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from _eva_models import eva_model
from _pruning_models import get_images, get_model
from _relpos_models import build as relpos_model
from timm.models.cait import Cait

from raggedvit.pruning import PrunedViT, PruneSpec
from raggedvit.pruning.merge import bipartite_soft_matching, merge_rows
from raggedvit.pruning.spec import merged_count
from raggedvit.weights import load_vit
from tests.support.testing import assert_close
from tests.support.tome_reference import tome_reference_forward

# (model key, r, merge_at, sample photos): deit_tiny (class token), a distilled DeiT (class + distillation), a ViT with
# registers (class + 4 registers, LayerScale), no class token (1 register, mean pooling)
CASES = [
    ("deit_tiny", 8, None, ("chelsea", "rocket")),
    ("deit_tiny", 16, (0, 2, 3, 7, 11), ("chelsea", "rocket")),
    ("deit_tiny_distilled", 8, None, ("chelsea", "rocket")),
    ("dinov2_reg4", 13, None, ("chelsea", "rocket")),
    ("wee_reg1_gap", 8, None, ("chelsea", "rocket")),
    # r above half the patches: merged_count caps it. Every A row merges, so every destination is decided: the
    # rocket's flat sky has similarity near-ties (1.3e-7 at block 0) that float32 rounding may order either way
    ("deit_tiny_d4", 100, None, ("chelsea", "coffee")),
]


def _check_against_reference(vit, images, spec: PruneSpec, merge_at) -> None:
    out = PrunedViT(vit, spec)(images)
    ref = tome_reference_forward(vit, images, spec.r, merge_at)
    B = images.shape[0]
    assert len(out.token_index) == len(ref.token_index) == len(out.token_size)
    for s, (index, size, cu) in enumerate(zip(out.token_index, out.token_size, out.cu_seqlens)):
        n = ref.token_index[s].shape[1]
        assert torch.equal(cu, torch.arange(B + 1) * n), f"stage {s} cu_seqlens"
        assert torch.equal(index.reshape(B, n), ref.token_index[s]), f"stage {s} merged rows (destination tokens)"
        assert torch.equal(size.reshape(B, n), ref.size[s]), f"stage {s} sizes"
        assert out.token_counts[:, s].tolist() == [n] * B
    assert_close(out.logits, ref.logits, rtol=1e-5, atol=1e-5, name="logits")


@pytest.mark.usefixtures("no_grad")
@pytest.mark.parametrize(("model_key", "r", "merge_at", "photos"), CASES)
def test_tome_equals_reference(model_key: str, r: int, merge_at: tuple[int, ...] | None, photos) -> None:
    vit, images = get_model(model_key), get_images(model_key, photos)
    _check_against_reference(vit, images, PruneSpec("tome", prune_at=merge_at or (), r=r), merge_at)


@functools.cache
def _layer_scale_vit() -> torch.nn.Module:
    """A ViT with registers and LayerScale gammas far from 1 (DINOv2 layout, 3 blocks)."""
    vit, _ = load_vit(
        "vit_small_patch14_reg4_dinov2", seed=0, img_size=112, model_kwargs={"depth": 3, "init_values": 1.0}
    )
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for blk in vit.blocks:
            for ls in (blk.ls1, blk.ls2):
                ls.gamma.copy_(0.3 + 1.2 * torch.rand(ls.gamma.shape, generator=gen))
    return vit.eval()


@pytest.mark.usefixtures("no_grad")
def test_layer_scale_is_applied() -> None:
    """PrunedViT's tome applies LayerScale (ToMe's own timm patch drops it): equal to the reference with it, far
    from the reference without it."""
    vit = _layer_scale_vit()
    images = torch.randn(2, 3, 112, 112, generator=torch.Generator().manual_seed(0))
    _check_against_reference(vit, images, PruneSpec("tome", r=6), None)
    out = PrunedViT(vit, PruneSpec("tome", r=6))(images)
    dropped = tome_reference_forward(vit, images, 6, layer_scale=False)
    assert (out.logits - dropped.logits).abs().max() > 1e-2


@pytest.mark.usefixtures("no_grad")
def test_tome_stage_structure() -> None:
    """Counts, sizes and names of the merged rows: every original token is in exactly one row's size, prefix rows
    stay first with size 1, the first merge block has no key bias (all sizes 1) and counts follow merged_count."""
    vit, images = get_model("deit_tiny_distilled"), get_images("deit_tiny_distilled")
    spec = PruneSpec("tome", r=8)
    model = PrunedViT(vit, spec)
    assert model.spec.prune_at == tuple(range(6)) and model.spec.r == 8
    out = model(images)
    n = 198
    for s, (index, size) in enumerate(zip(out.token_index, out.token_size)):
        n -= merged_count(n, 2, 8)
        index, size = index.reshape(2, n), size.reshape(2, n)
        assert index[:, :2].tolist() == [[0, 1]] * 2 and size[:, :2].tolist() == [[1.0, 1.0]] * 2
        assert size.sum(dim=1).tolist() == [198.0] * 2
        assert all(len(set(row.tolist())) == n for row in index)
        trace = out.stages[s]
        assert trace.k.tolist() == [8, 8] and trace.kept.tolist() == [n, n]
    assert out.token_counts.tolist() == [[190, 182, 174, 166, 158, 150]] * 2


def test_merge_rows_is_a_size_weighted_average() -> None:
    """merge_rows on hand-made rows: p = 1, n = 7 (A = 2, 4, 6; B = 1, 3, 5), the two most similar A rows merge."""
    metric = torch.tensor([[0, 0, 1], [1, 0, 0], [0.9, 0.1, 0], [0, 1, 0], [0, 0.8, 0.2], [0, 0, 1], [0.2, 0.3, 0.5]])
    x = torch.arange(7 * 2, dtype=torch.float32).reshape(1, 7, 2)
    size = torch.tensor([[1.0, 2.0, 1.0, 3.0, 1.0, 1.0, 4.0]])
    match = bipartite_soft_matching(metric[None], 1, 2)
    assert match.merged.tolist() == [[0, 1]] and match.dst.tolist() == [[0, 1]] and match.kept.tolist() == [[2]]
    new_x, new_size = merge_rows(x, size, match, 1)
    assert new_size.tolist() == [[1.0, 4.0, 3.0, 4.0, 1.0]]  # cls, A row 6, B rows 1 (+2), 3 (+4), 5
    expect_b1 = (x[0, 1] * 2 + x[0, 2] * 1) / 3
    expect_b3 = (x[0, 3] * 3 + x[0, 4] * 1) / 4
    assert_close(new_x[0], torch.stack((x[0, 0], x[0, 6], expect_b1, expect_b3, x[0, 5])), rtol=0, atol=1e-6)


def test_spec() -> None:
    assert PruneSpec("tome", r=8).to_dict() == {
        "policy": "tome", "prune_at": [], "keep": 0.5, "mass": 0.9, "fuse": False, "r": 8,
    }  # fmt: skip
    assert "r" not in PruneSpec("topk-l2", prune_at=(4,)).to_dict()
    spec = PruneSpec.from_dict({"policy": "tome", "prune_at": [0, 5], "r": 16})
    assert spec == PruneSpec.from_strings("tome", "0,5", r="16") and spec.num_stages == 2
    assert PruneSpec("tome", r=4).resolve(3).prune_at == (0, 1, 2)
    assert merged_count(197, 1, 8) == 8 and merged_count(21, 1, 16) == 10 and merged_count(2, 1, 4) == 0
    for kwargs, text in [
        ({"policy": "tome"}, "needs r >= 1"),
        ({"policy": "tome", "r": -1}, "needs r >= 1"),
        ({"policy": "topk-l2", "prune_at": (4,), "r": 8}, "only defined for policy 'tome'"),
        ({"policy": "tome", "prune_at": (-1,), "r": 8}, "must be >= 0"),
        ({"policy": "tome", "prune_at": (3, 2), "r": 8}, "strictly increasing"),
    ]:
        with pytest.raises(ValueError, match=text):
            PruneSpec(**kwargs)
    with pytest.raises(ValueError, match="tome block index 12 out of range 0..11"):
        PruneSpec("tome", prune_at=(12,), r=8).check_model(depth=12, has_class_token=True)


@pytest.mark.parametrize(
    ("build", "text"),
    [
        (lambda: eva_model("eva02"), "Eva blocks rotate q and k"),
        (lambda: relpos_model("beit"), "BEiT's relative position bias"),
        (lambda: relpos_model("relpos-mlp"), "its relative position bias is looked up"),
        (
            lambda: Cait(img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=4, depth_token_only=1),
            "CaiT.s talking-heads",
        ),
    ],
)
def test_position_families_refuse_tome(build, text: str) -> None:
    """Rope and relative-position families have no position for a merged token, CaiT no merge path: a clear
    ValueError naming why."""
    with pytest.raises(ValueError, match=f"policy 'tome' cannot run .*: {text}"):
        PrunedViT(build(), PruneSpec("tome", r=4))


@pytest.mark.usefixtures("no_grad")
def test_tome_with_ragged_linear_and_capacity_flags() -> None:
    """The ragged linear op's GEMMs and the capacity flag run tome the same way (tome states have no dead rows)."""
    vit, images = get_model("deit_tiny_d3"), get_images("deit_tiny_d3")
    spec = PruneSpec("tome", r=10)
    base = PrunedViT(vit, spec)(images)
    for kwargs in ({"capacity": True}, {"ragged_linear": True}):
        other = PrunedViT(copy.deepcopy(vit), spec, **kwargs)(images)
        assert_close(other.logits, base.logits, rtol=1e-5, atol=1e-5, name=f"logits {kwargs}")
        assert all(torch.equal(a, b) for a, b in zip(other.token_index, base.token_index))
