"""Self-tests of the method references in tests/support (EViT, DynamicViT, ToMe), without raggedvit code: the
neutral settings equal timm's own forward, token counts follow the published formulas, the rows each keeps are
well formed, and a DynamicViT checkpoint round-trips."""

from __future__ import annotations

import functools

import pytest
import timm
import torch
from timm.models.vision_transformer import VisionTransformer

from tests.support.dynamicvit_reference import (
    dynamicvit_checkpoint,
    dynamicvit_keep_counts,
    dynamicvit_predictor_state,
    dynamicvit_reference_forward,
    split_dynamicvit_checkpoint,
)
from tests.support.evit_reference import FUSED, evit_keep_count, evit_reference_forward
from tests.support.tome_reference import tome_merge_count, tome_reference_forward

DEPTH = 10  # the default stages sit at blocks 3, 6, 9
TOKENS = 197  # deit_tiny at 224: class token + 14 * 14 patches


@functools.cache
def _vit(name: str = "deit_tiny_patch16_224", depth: int = DEPTH, **kwargs) -> VisionTransformer:
    """A seeded timm ViT in eval mode with q and k rows of every qkv weight times 4 (peaked attention)."""
    torch.manual_seed(0)
    vit = timm.create_model(name, pretrained=False, depth=depth, **kwargs).eval()
    with torch.no_grad():
        for blk in vit.blocks:
            dim = blk.attn.qkv.in_features
            blk.attn.qkv.weight[: 2 * dim] *= 4
    return vit


@functools.cache
def _images() -> torch.Tensor:
    """[2, 3, 224, 224] float32."""
    return torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(1))


def _assert_rel(got: torch.Tensor, want: torch.Tensor, rel: float = 1e-5) -> None:
    err, scale = (got - want).abs().max().item(), want.abs().max().item()
    assert err <= rel * scale, f"max abs error {err:.3g} > {rel:g} * {scale:.3g}"


def _all_tokens(index: torch.Tensor) -> bool:
    return all(sorted(row.tolist()) == list(range(TOKENS)) for row in index)


def test_neutral_settings_equal_timm() -> None:
    """keep_rate 1 (EViT, with and without fuse), rho 1 (DynamicViT) and r = 0 (ToMe) are timm's forward."""
    vit, images = _vit(), _images()
    with torch.no_grad():
        want = vit(images)
    for fuse in (False, True):
        evit = evit_reference_forward(vit, images, 1.0, fuse_token=fuse)
        _assert_rel(evit.logits, want)
        assert evit.counts.tolist() == [[TOKENS] * 3] * 2 and all(_all_tokens(k) for k in evit.kept_index)
    dyn = dynamicvit_reference_forward(vit, dynamicvit_predictor_state(vit.embed_dim), images, rho=1.0)
    _assert_rel(dyn.logits, want)
    assert dyn.counts.tolist() == [[TOKENS] * 3] * 2 and all(_all_tokens(k) for k in dyn.kept_index)
    tome = tome_reference_forward(vit, images, 0)
    _assert_rel(tome.logits, want)
    assert all(_all_tokens(k) for k in tome.token_index) and all((s == 1).all() for s in tome.size)


def test_evit_counts_and_rows() -> None:
    """keep 0.7 at (3, 6, 9): ceil(0.7 * (N - 1)) of N rows, N counting an earlier fused token; class token first,
    the fused token (FUSED) last, every token named once, each stage's tokens taken from the previous stage's."""
    vit, images = _vit(), _images()
    for fuse, want in ((False, [139, 98, 69]), (True, [140, 100, 72])):
        n, counts = TOKENS, []
        for _ in range(3):
            n = 1 + evit_keep_count(0.7, n - 1) + fuse
            counts.append(n)
        assert counts == want
        ref = evit_reference_forward(vit, images, 0.7, fuse_token=fuse)
        assert ref.counts.tolist() == [want] * 2
        previous = [set(range(TOKENS))] * 2
        for index in ref.kept_index:
            assert (index[:, 0] == 0).all() and ((index[:, -1] == FUSED) == fuse).all()
            for b, row in enumerate(index.tolist()):  # an earlier fused token may be kept beside the new one
                tokens = [t for t in row if t != FUSED]
                assert len(set(tokens)) == len(tokens) and set(row) <= previous[b] | {FUSED}
            previous = [set(row) for row in index.tolist()]
    assert evit_keep_count(0.7, 196) == 138 and evit_keep_count(0.5, 10) == 5


def test_evit_fuse_differs_from_drop() -> None:
    """The fused token changes the logits and the later stages; the first stage keeps the same tokens."""
    vit, images = _vit(), _images()
    drop = evit_reference_forward(vit, images, 0.7)
    fuse = evit_reference_forward(vit, images, 0.7, fuse_token=True)
    assert torch.equal(fuse.kept_index[0][:, :-1], drop.kept_index[0])
    assert (fuse.logits - drop.logits).abs().max() > 1e-3


def test_evit_refuses_a_model_without_class_token() -> None:
    vit = _vit(depth=1, class_token=False, global_pool="avg")
    with pytest.raises(ValueError, match="no class token"):
        evit_reference_forward(vit, _images(), 0.7, drop_loc=(0,))


def test_dynamicvit_counts_and_scores() -> None:
    """rho 0.7 at (3, 6, 9): 1 + int(196 * 0.7 ** (s + 1)) rows; the seeded predictor's keep scores are varied; the
    kept rows are the highest-scoring candidates, in descending score, taken from the previous stage's."""
    vit, images = _vit(), _images()
    keep = dynamicvit_keep_counts(TOKENS - 1, 0.7)
    assert keep == (137, 96, 67)
    ref = dynamicvit_reference_forward(vit, dynamicvit_predictor_state(vit.embed_dim, seed=0), images)
    assert ref.counts.tolist() == [[1 + k for k in keep]] * 2
    previous = torch.arange(TOKENS).expand(2, -1)
    for score, index, k in zip(ref.keep_score, ref.kept_index, keep):
        ranked = score.sort(dim=1, descending=True).values
        assert score.std() > 0.1 and (ranked[:, k - 1] - ranked[:, k] > 1e-5).all()  # varied, a clear cut
        assert (index[:, 0] == 0).all()
        top = score.sort(dim=1, descending=True).indices[:, :k]
        assert torch.equal(index[:, 1:], torch.take_along_dim(previous[:, 1:], top, dim=1))
        previous = index


def test_dynamicvit_checkpoint_round_trips(tmp_path) -> None:
    """{"model": state} and the bare state, saved and loaded: the backbone loads strictly into a fresh timm model,
    the predictor keeps DynamicViT's names, and the forward is unchanged."""
    vit, images, loc = _vit(depth=7), _images(), (2, 4, 6)
    checkpoint = dynamicvit_checkpoint(vit, seed=3)
    names = {f"score_predictor.{s}.{layer}.{t}" for s in range(3) for layer in (
        "in_conv.0", "in_conv.1", "out_conv.0", "out_conv.2", "out_conv.4") for t in ("weight", "bias")}  # fmt: skip
    assert set(checkpoint["model"]) == set(vit.state_dict()) | names
    want = dynamicvit_reference_forward(vit, dynamicvit_predictor_state(vit.embed_dim, seed=3), images, 0.6, loc)
    for saved in (checkpoint, checkpoint["model"]):
        torch.save(saved, tmp_path / "dyvit.pth")
        backbone, predictor = split_dynamicvit_checkpoint(torch.load(tmp_path / "dyvit.pth", weights_only=True))
        assert set(predictor) == names
        fresh = timm.create_model("deit_tiny_patch16_224", pretrained=False, depth=7).eval()
        fresh.load_state_dict(backbone, strict=True)
        got = dynamicvit_reference_forward(fresh, predictor, images, 0.6, loc)
        assert torch.equal(got.logits, want.logits)
        assert all(torch.equal(a, b) for a, b in zip(got.kept_index, want.kept_index))


def test_tome_counts_and_rows() -> None:
    """r = min(r, (t - protected) // 2) per block; prefix rows first with size 1; sizes add up to every token."""
    vit, images = _vit(), _images()
    for r in (8, 100):
        ref = tome_reference_forward(vit, images, r)
        t, counts = TOKENS, []
        for _ in range(DEPTH):
            t -= tome_merge_count(t, 1, r)
            counts.append(t)
        assert [k.shape[1] for k in ref.token_index] == counts
        for index, size in zip(ref.token_index, ref.size):
            assert (index[:, 0] == 0).all() and (size[:, 0] == 1).all()
            assert (size.sum(dim=1) == TOKENS).all() and all(len(set(row.tolist())) == len(row) for row in index)
    assert counts == [99, 50, 26, 14, 8, 5, 3, 2, 2, 2]


def test_tome_row_order() -> None:
    """With a class token the unmerged A rows come back in row order (ToMe's sort for the class token), then B;
    with a distillation token it stays second; without a class token the unmerged rows stay in similarity order."""
    images = _images()
    ref = tome_reference_forward(_vit(depth=1), images, 16)
    index = ref.token_index[0]  # 181 rows: class token, 82 unmerged A (even), 98 B (odd) rows
    assert index.shape[1] == 181 and torch.equal(index[:, 83:], torch.arange(1, TOKENS, 2).expand(2, -1))
    assert (index[:, 1:83].diff(dim=1) > 0).all() and (index[:, 1:83] % 2 == 0).all()
    distilled = tome_reference_forward(_vit("deit_tiny_distilled_patch16_224", depth=1), images, 16)
    assert (distilled.token_index[0][:, :2] == torch.tensor([0, 1])).all()
    gap = tome_reference_forward(_vit(depth=1, class_token=False, global_pool="avg"), images, 16)
    unmerged = gap.token_index[0][:, : 98 - 16]  # 196 patches: A = even rows, 98 of them
    assert (unmerged % 2 == 0).all() and not (unmerged.diff(dim=1) > 0).all()
