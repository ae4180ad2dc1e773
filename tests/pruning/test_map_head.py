"""map_pool (SigLIP's MAP head on packed rows) against timm's AttentionPoolLatent run image by image."""

from __future__ import annotations

import pytest
import torch
from timm.layers import AttentionPoolLatent

from raggedvit.pruning.map_head import check_map_pool, map_pool
from tests.support.testing import assert_close

C, HEADS = 32, 4


def _pool(gen: torch.Generator, **kwargs) -> AttentionPoolLatent:
    """A pool with random weights: biases, norm gains and the latent are all non-trivial."""
    pool = AttentionPoolLatent(C, num_heads=HEADS, mlp_ratio=2.0, norm_layer=torch.nn.LayerNorm, **kwargs)
    with torch.no_grad():
        for p in pool.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (0.3 if p.dim() >= 2 else 0.5) + (p.dim() == 1) * 0.5)
    return pool.eval()


def _reference(pool: AttentionPoolLatent, x: torch.Tensor, cu: torch.Tensor, skip: int = 0) -> torch.Tensor:
    """timm's module on each image's rows alone (a batch of one)."""
    return torch.cat([pool(x[int(cu[b]) + skip : int(cu[b + 1])].unsqueeze(0)) for b in range(cu.numel() - 1)])


CONFIGS = {
    "siglip": {},  # what VisionTransformer(global_pool='map') builds: latent_len 1, pool 'token'
    "qknorm-latent3-avg": {"qk_norm": True, "latent_len": 3, "pool_type": "avg"},
    "latent2-token-noqproj": {"latent_len": 2, "q_proj": False},
    "latent2-nopool": {"latent_len": 2, "pool_type": ""},
    "pre-logits": {"out_features": 0},
}


@pytest.mark.parametrize("config", CONFIGS, ids=list(CONFIGS))
@pytest.mark.parametrize("counts", [(7, 7, 7), (5, 1, 9), (9,)], ids=["uniform", "ragged", "one"])
def test_map_pool_equals_timm_per_image(config, counts, gen, no_grad):
    pool = _pool(gen, **CONFIGS[config])
    cu = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()])
    x = torch.randn(int(cu[-1]), C, generator=gen)
    got = map_pool(pool, x, cu, width=max(counts) + 2)  # wider than needed: padding must not leak
    assert_close(got, _reference(pool, x, cu), rtol=1e-5, name=config)


def test_map_pool_on_pruned_rows_equals_timm_on_those_rows(gen, no_grad):
    """A pruned subset: timm's pool on a batch-1 tensor of the kept rows of each image."""
    pool = _pool(gen)
    full = torch.randn(2, 10, C, generator=gen)
    kept = [torch.tensor([0, 3, 4, 8]), torch.tensor([1, 2, 5, 6, 7, 9])]
    x = torch.cat([full[b, k] for b, k in enumerate(kept)])
    cu = torch.tensor([0, 4, 10])
    got = map_pool(pool, x, cu, width=10)
    ref = torch.cat([pool(full[b, k].unsqueeze(0)) for b, k in enumerate(kept)])
    assert_close(got, ref, rtol=1e-5)


def test_map_pool_skips_prefix_rows(gen, no_grad):
    pool = _pool(gen)
    cu = torch.tensor([0, 6, 9])
    x = torch.randn(9, C, generator=gen)
    assert_close(map_pool(pool, x, cu, width=6, skip=2), _reference(pool, x, cu, skip=2), rtol=1e-5)


def test_padding_rows_get_zero_weight(gen, no_grad):
    """Huge values in another image's rows or beyond must not change an image's result."""
    pool = _pool(gen)
    x = torch.randn(8, C, generator=gen)
    cu = torch.tensor([0, 3, 8])
    base = map_pool(pool, x, cu, width=8)
    x2 = x.clone()
    x2[3:] = 1e4
    torch.testing.assert_close(map_pool(pool, x2, cu, width=8)[0], base[0], rtol=0, atol=0)


def test_unsupported_pool_is_refused():
    with torch.device("meta"):
        pool = AttentionPoolLatent(C, num_heads=HEADS, pos_embed="abs", feat_size=4)
    with pytest.raises(ValueError, match="pos_embed='abs' is not supported"):
        check_map_pool(pool)
    with pytest.raises(ValueError, match="only timm's AttentionPoolLatent"):
        check_map_pool(torch.nn.Identity())


def test_pruned_siglip_equals_timm_on_the_kept_tokens(no_grad):
    """SigLIP (MAP head) with a topk-l2 stage at block 1: timm's block 1, norm and MAP head run on each image's
    kept tokens (taken from the token grid by token_index) give PrunedViT's output."""
    from raggedvit.coverage.model import reduced_model
    from raggedvit.pruning import PrunedViT, PruneSpec

    vit, _ = reduced_model("vit_base_patch16_siglip_224", depth=2, img_size=64)
    images = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    out = PrunedViT(vit, PruneSpec("topk-l2", (1,), keep=0.4))(images)
    x = vit.blocks[0](vit.norm_pre(vit._pos_embed(vit.patch_embed(images))))
    index, cu = out.token_index[0], out.cu_seqlens[0]
    ref = []
    for b in range(2):
        kept = index[cu[b] : cu[b + 1]]
        assert kept.tolist() != list(range(len(kept)))  # not a prefix of the grid: positions matter
        ref.append(vit.forward_head(vit.norm(vit.blocks[1](x[b : b + 1, kept]))))
    assert_close(out.logits, torch.cat(ref), rtol=1e-5, name="pooled features")
