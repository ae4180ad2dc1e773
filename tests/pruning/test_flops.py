"""FLOPs from token counts per stage, against the ViT formula written out by hand."""

from __future__ import annotations

import pytest
import torch

from raggedvit.pruning import PrunedViT, PruneSpec, backbone_for
from raggedvit.pruning.flops import image_flops, unpruned_flops
from raggedvit.weights import load_vit


def _vit_formula(counts_per_block: list[float], c: int, patches: int, patch: int, classes: int) -> float:
    """Embedding 2 P (3 p^2) C; per block of n rows 2 n (3C^2 + C^2 + 4C^2 + 4C^2) + 2 n^2 C (QK^T) + 2 n^2 C (AV);
    head 2 C classes (mlp ratio 4, attention width C)."""
    blocks = sum(24 * n * c * c + 4 * n * n * c for n in counts_per_block)
    return 2 * patches * 3 * patch * patch * c + blocks + 2 * c * classes


def test_flops_of_deit_tiny_follow_the_token_counts() -> None:
    vit, _ = load_vit("deit_tiny_patch16_224", seed=0, img_size=64, model_kwargs={"depth": 6})
    bb = backbone_for(vit)
    n0 = 16 + 1  # 64 px: 4 x 4 patches + the class token
    assert unpruned_flops(bb) == pytest.approx(_vit_formula([n0] * 6, 192, 16, 16, 1000))
    counts = torch.tensor([[9, 5], [12, 12]])  # two images, stages at blocks 2 and 4
    got = image_flops(bb, (2, 4), counts)
    want = [
        _vit_formula([n0, n0, 9, 9, 5, 5], 192, 16, 16, 1000),
        _vit_formula([n0, n0, 12, 12, 12, 12], 192, 16, 16, 1000),
    ]
    assert got.tolist() == pytest.approx(want)
    with pytest.raises(ValueError, match=r"expected \[B, 2\]"):
        image_flops(bb, (2, 4), counts[:, :1])


def test_flops_take_prunedvit_token_counts() -> None:
    vit, _ = load_vit("deit_tiny_patch16_224", seed=0, img_size=64, model_kwargs={"depth": 4})
    spec = PruneSpec("topk-l2", (2,), keep=0.5)
    with torch.no_grad():
        out = PrunedViT(vit, spec)(torch.randn(2, 3, 64, 64))
    flops = image_flops(backbone_for(vit), spec.prune_at, out.token_counts)
    assert flops.tolist() == pytest.approx([_vit_formula([17, 17, 9, 9], 192, 16, 16, 1000)] * 2)


def test_stages_inside_a_block_leave_its_attention_on_the_rows_before() -> None:
    """Token merging runs between a block's attention and its MLP: that block's attention keeps the old count."""
    vit, _ = load_vit("deit_tiny_patch16_224", seed=0, img_size=64, model_kwargs={"depth": 2})
    bb, c = backbone_for(vit), 192
    fixed = 2 * 16 * 3 * 16 * 16 * c + 2 * c * 1000
    attn = lambda n: 8 * n * c * c + 4 * n * n * c  # qkv + proj, QK^T + AV
    mlp = lambda n: 16 * n * c * c
    got = image_flops(bb, (0, 1), torch.tensor([[13, 9]]), inside=True)
    assert float(got[0]) == pytest.approx(fixed + attn(17) + mlp(13) + attn(13) + mlp(9))
