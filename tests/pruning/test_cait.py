"""CaiT in PrunedViT: talking-heads patch blocks and the class-attention tail over each image's kept rows,
against timm's own modules run on exactly those tokens."""

from __future__ import annotations

import functools

import pytest
import torch

from raggedvit.coverage.model import reduced_model
from raggedvit.pruning import PrunedViT, PruneSpec
from raggedvit.pruning.backbone import PackedState
from raggedvit.pruning.families import backbone_for
from raggedvit.pruning.families.cait import CaitBackbone
from tests.support.testing import assert_close

IMG = 64  # 4 x 4 patches


@functools.cache
def _cait(depth: int = 3, global_pool: str = "token"):
    model, _ = reduced_model("cait_xxs24_224", depth=depth, img_size=IMG, kwargs={"global_pool": global_pool})
    return model


def _images(batch: int = 3) -> torch.Tensor:
    return torch.randn(batch, 3, IMG, IMG, generator=torch.Generator().manual_seed(0))


def _timm_tail(model, x: torch.Tensor, start: int) -> torch.Tensor:
    """timm's forward from patch block `start` on: tokens [1, n, C] -> logits [1, classes]."""
    for blk in model.blocks[start:]:
        x = blk(x)
    return model.forward_head(model.norm(model.forward_cls(x)))


def _timm_tokens(model, images: torch.Tensor) -> torch.Tensor:
    return model.pos_drop(model.patch_embed(images) + model.pos_embed)


@pytest.mark.usefixtures("no_grad")
@pytest.mark.parametrize("global_pool", ["token", "avg"])
def test_policy_none_equals_timm(global_pool):
    model, images = _cait(global_pool=global_pool), _images()
    assert_close(PrunedViT(model, PruneSpec())(images).logits, model(images), rtol=1e-5, name="logits")


@pytest.mark.usefixtures("no_grad")
def test_pruned_forward_equals_timm_on_the_kept_tokens():
    """topk-l2 after block 1: timm's blocks 1.., class attention and head on each image's kept tokens (taken
    from the original token grid by token_index) give PrunedViT's logits."""
    model, images = _cait(), _images()
    out = PrunedViT(model, PruneSpec("topk-l2", (1,), keep=0.4))(images)
    x = model.blocks[0](_timm_tokens(model, images))
    index, cu = out.token_index[0], out.cu_seqlens[0]
    assert out.token_counts[:, 0].tolist() == [7] * images.shape[0]  # ceil(0.4 x 16)
    ref = []
    for b in range(images.shape[0]):
        kept = index[cu[b] : cu[b + 1]]
        assert kept.tolist() != list(range(len(kept)))  # the kept tokens are not a prefix: positions matter
        ref.append(_timm_tail(model, x[b : b + 1, kept], 1))
    assert_close(out.logits, torch.cat(ref), rtol=1e-5, name="logits")


@pytest.mark.usefixtures("no_grad")
@pytest.mark.parametrize("global_pool", ["token", "avg"])
def test_backbone_on_ragged_rows_equals_timm_per_image(global_pool):
    """Blocks and tail on packed rows with different counts per image, padded wider than any image: the key
    masks keep padding out (talking heads: before the softmax and after proj_w)."""
    model = _cait(global_pool=global_pool)
    bb = backbone_for(model)
    assert isinstance(bb, CaitBackbone)
    tokens = _timm_tokens(model, _images())
    kept = [torch.tensor([0, 5, 6, 15]), torch.tensor([3]), torch.tensor([1, 2, 4, 7, 8, 9, 10, 11, 12])]
    counts = torch.tensor([len(k) for k in kept])
    cu = torch.cat((torch.zeros(1, dtype=torch.int64), counts.cumsum(0)))
    seq_id = torch.repeat_interleave(torch.arange(len(kept)), counts)
    pos = torch.cat([torch.arange(len(k)) for k in kept])
    state = PackedState(torch.cat([tokens[b, k] for b, k in enumerate(kept)]), cu, seq_id, pos, torch.cat(kept))
    width = 12
    for i in range(bb.depth):
        state = state._replace(x=bb.block(i, state, max_seqlen=width, return_cls_attn=False, attention=None))
    got = bb.head(state, width)
    ref = torch.cat([_timm_tail(model, tokens[b : b + 1, k], 0) for b, k in enumerate(kept)])
    assert_close(got, ref, rtol=1e-5, name="logits")


@pytest.mark.parametrize("policy", ["evit", "cls-mass"])
def test_cls_attention_policies_are_refused(policy):
    with pytest.raises(ValueError, match=rf"policy '{policy}' needs a class token in the pruned blocks") as info:
        PrunedViT(_cait(), PruneSpec(policy, (1,)))
    assert "\n" not in str(info.value) and "use topk-l2" in str(info.value)


def test_structure_and_refusals():
    bb = backbone_for(_cait())
    assert (bb.num_prefix, bb.has_class_token, bb.depth, bb.tokens_per_image()) == (0, False, 3, 16)
    half = bb.half_modules("fp16-all")
    assert all(any(h is blk for h in half) for blk in [*bb.model.blocks, *bb.model.blocks_token_only])
    fp16 = bb.half_modules("fp16")
    assert any(h is bb.model.blocks_token_only[1].attn for h in fp16)
    with torch.device("meta"):
        import timm

        headless = timm.create_model("cait_xxs24_224", depth=2, global_pool="")
    with pytest.raises(ValueError, match="CaiT global_pool '' is not supported"):
        backbone_for(headless)
