"""BEiT and VisionTransformerRelPos in PrunedViT: the op's position tables equal timm's dense biases, policy none
equals timm's forward, a pruned forward equals timm's forward on the same kept tokens at their original positions,
and the policies a model cannot run are refused."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from _relpos_models import IMG, MODELS, TINY, WITH_CLASS_TOKEN, build, masked_dense_forward
from timm.layers.pos_embed_rel import RelPosBias, RelPosMlp
from timm.models.beit import Attention as BeitAttention
from timm.models.beit import Beit, RelativePositionBias
from timm.models.vision_transformer_relpos import VisionTransformerRelPos

import raggedvit.pruning.families.beit as beit_family
from raggedvit.pruning import PrunedViT, PruneSpec
from raggedvit.pruning.relpos import beit_table, dense_bias, relpos_table
from tests.support.testing import assert_close

GRIDS = [(3, 4), (4, 3), (1, 1), (5, 5)]
HEADS = 3


def _randomised(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    return module.eval()


@pytest.mark.parametrize("grid", GRIDS, ids=str)
def test_beit_tables_equal_timms_dense_bias(grid):
    """Per-block table, shared table, and the two added (timm adds the dense biases): all N x N pairs."""
    attn = _randomised(BeitAttention(12, HEADS, qkv_bias=True, window_size=grid))
    shared = _randomised(RelativePositionBias(grid, HEADS), seed=1)
    n = grid[0] * grid[1] + 1
    idx = torch.arange(n)
    with torch.no_grad():
        own, both = attn._get_rel_pos_bias()[0], attn._get_rel_pos_bias()[0] + shared()
        assert_close(dense_bias(beit_table(attn, None, grid), idx, grid, 1), own, name="block")
        assert_close(dense_bias(beit_table(attn, shared, grid), idx, grid, 1), both, name="block + shared")
        no_own = BeitAttention(12, HEADS, window_size=None)
        assert_close(dense_bias(beit_table(no_own, shared, grid), idx, grid, 1), shared(), name="shared")
        assert beit_table(no_own, None, grid) is None


@pytest.mark.parametrize("grid", GRIDS, ids=str)
@pytest.mark.parametrize(
    "make",
    [
        partial(RelPosBias, prefix_tokens=0),
        partial(RelPosBias, prefix_tokens=1),
        partial(RelPosMlp, prefix_tokens=0, mode="cr"),
        partial(RelPosMlp, prefix_tokens=1, mode="cr"),
        partial(RelPosMlp, prefix_tokens=1, mode="swin"),
    ],
    ids=["bias", "bias-cls", "mlp-cr", "mlp-cr-cls", "mlp-swin-cls"],
)
def test_relpos_tables_equal_timms_dense_bias(grid, make):
    rel = _randomised(make(window_size=grid, num_heads=HEADS))
    if getattr(rel, "mode", None) == "swin" and 1 in grid:
        pytest.skip("timm's swin log coordinates divide by window - 1: NaN in timm itself")
    p = rel.prefix_tokens
    idx = torch.arange(grid[0] * grid[1] + p)
    with torch.no_grad():
        table = relpos_table(rel, grid)
        assert table.shape == (HEADS, (2 * grid[0] - 1) * (2 * grid[1] - 1) + 3) and table.dtype == torch.float32
        assert_close(dense_bias(table, idx, grid, p), rel.get_bias()[0], name=type(rel).__name__)


def test_window_other_than_the_grid_is_refused():
    with pytest.raises(ValueError, match=r"relative position window \(3, 3\) != patch grid \(3, 4\)"):
        relpos_table(RelPosBias((3, 3), HEADS), (3, 4))
    with pytest.raises(ValueError, match=r"block relative position window \(3, 3\) != patch grid \(3, 4\)"):
        beit_table(BeitAttention(12, HEADS, window_size=(3, 3)), None, (3, 4))


def _images(seed: int = 0, batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 3, *IMG, generator=torch.Generator().manual_seed(seed))


@pytest.mark.usefixtures("no_grad")
@pytest.mark.parametrize("name", list(MODELS))
def test_policy_none_equals_timm(name):
    model, x = build(name), _images()
    got = PrunedViT(model, PruneSpec())(x).logits
    assert_close(got, model(x), rtol=1e-4, name=name)


def _keep_mask(out, batch: int, n: int) -> torch.Tensor:
    """keep [B, N]: the original tokens of the first stage's kept rows (the fused token, -1, is not one)."""
    index, cu = out.token_index[0], out.cu_seqlens[0]
    image = torch.repeat_interleave(torch.arange(batch), cu[1:] - cu[:-1])
    keep = torch.zeros(batch, n, dtype=torch.bool)
    real = index >= 0
    keep[image[real], index[real]] = True
    return keep


SPECS = {
    "topk-l2": PruneSpec("topk-l2", (1,), keep=0.5),
    "cls-mass": PruneSpec("cls-mass", (1,), mass=0.8),
    "evit": PruneSpec("evit", (0,), keep=0.4),  # inside block 0: its MLP is per row, so block 1 on sees the cut
}


# topk-l2 on every model; the class-attention policies on two class-token models each (CI time)
PRUNED_CASES = [(name, "topk-l2") for name in MODELS] + [
    ("beit", "evit"),
    ("relpos-swin-cls", "evit"),
    ("beit-shared-abs-token", "cls-mass"),
    ("relpos-bias-cls-gap", "cls-mass"),
]


@pytest.mark.usefixtures("no_grad")
@pytest.mark.parametrize("name,policy", PRUNED_CASES, ids=[f"{n}-{p}" for n, p in PRUNED_CASES])
def test_pruned_forward_is_timms_on_the_kept_tokens(name, policy):
    """A stage at block 1: PrunedViT's logits equal timm's own blocks on all tokens with the dropped keys masked
    out (each kept token at its original position) and the head over the kept tokens."""
    assert name in WITH_CLASS_TOKEN or policy == "topk-l2"
    model, x = build(name), _images(1)
    spec = SPECS[policy]
    out = PrunedViT(model, spec)(x)
    n = model.patch_embed.num_patches + model.num_prefix_tokens
    keep = _keep_mask(out, x.shape[0], n)
    assert keep.sum(1).tolist() == out.token_counts[:, 0].tolist()
    assert keep.sum(1).min() < n, "nothing pruned: the test would not see positions"
    assert_close(out.logits, masked_dense_forward(model, x, keep, at=1), rtol=1e-4, name=f"{name} {policy}")


@pytest.mark.usefixtures("no_grad")
@pytest.mark.parametrize("name", ["beit", "relpos-mlp"])
def test_packed_row_positions_would_be_caught(monkeypatch, name):
    """The check above sees positions: giving the op each row's packed position instead of its original token
    index moves the logits far beyond the tolerance."""
    model, x = build(name), _images(1)
    spec = SPECS["topk-l2"]
    out = PrunedViT(model, spec)(x)
    real = beit_family.ragged_attention

    def packed_positions(qkv, cu, heads, **kw):
        if kw.get("token_pos") is not None:
            seq = torch.repeat_interleave(torch.arange(cu.shape[0] - 1), cu[1:] - cu[:-1])
            kw["token_pos"] = torch.arange(qkv.shape[0]) - cu[seq]
        return real(qkv, cu, heads, **kw)

    monkeypatch.setattr(beit_family, "ragged_attention", packed_positions)
    wrong = PrunedViT(model, spec)(x).logits
    scale = float(out.logits.abs().max())
    assert float((wrong - out.logits).abs().max()) > 1e-3 * scale  # 10x the tolerance


@pytest.mark.parametrize("policy", ["evit", "cls-mass"])
def test_cls_policies_refused_without_class_token(policy):
    model = build("relpos-mlp")
    with pytest.raises(ValueError, match=f"^policy '{policy}' needs a class token") as err:
        PrunedViT(model, PruneSpec(policy, (1,)))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("cls", [VisionTransformerRelPos, Beit], ids=lambda c: c.__name__)
def test_no_pooling_is_refused(cls):
    model = cls(**TINY, global_pool="")
    with pytest.raises(ValueError, match=f"^global_pool '' is not supported for {cls.__name__}; expected 'avg' or"):
        PrunedViT(model, PruneSpec())
