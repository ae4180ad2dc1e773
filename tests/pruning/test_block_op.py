"""PrunedViT(engine="block"): every timm Block through the block op, same outputs as the per-op blocks, for every
policy and layout (cls attention where a stage follows, dead rows of the capacity layout, token-pooling head)."""

from __future__ import annotations

import pytest
import torch

import raggedvit.pruning.packed_block as packed_block
from raggedvit.pruning import PrunedViT, PruneSpec
from raggedvit.pruning.precision import apply_dtype
from raggedvit.weights import load_vit, perturb_biases_and_norms_

SPECS = {
    "topk-l2": PruneSpec.from_strings("topk-l2", "1,3", 0.5, 0.9, False),
    "cls-mass": PruneSpec.from_strings("cls-mass", "1,3", 0.5, 0.9, False),
    "evit-fuse": PruneSpec.from_strings("evit", "1,3", 0.5, 0.9, True),
}


@pytest.fixture(scope="module")
def vit():
    model, _ = load_vit("deit_tiny_patch16_224", seed=1, model_kwargs={"depth": 4})
    return perturb_biases_and_norms_(model).eval()


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    return torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))


def _counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    op = packed_block.vit_block

    def counting(*args, **kwargs):
        calls[0] += 1
        return op(*args, **kwargs)

    monkeypatch.setattr(packed_block, "vit_block", counting)
    return calls


@pytest.mark.parametrize("capacity", [False, True], ids=["compact", "capacity"])
@pytest.mark.parametrize("policy", list(SPECS))
def test_block_engine_matches_ops(vit, images, monkeypatch, policy: str, capacity: bool) -> None:
    spec = SPECS[policy]
    calls = _counted(monkeypatch)
    with torch.no_grad():
        ref = PrunedViT(vit, spec, capacity=capacity)(images)
        assert calls[0] == 0
        out = PrunedViT(vit, spec, capacity=capacity, engine="block")(images)
    assert calls[0] == 4  # every block
    assert torch.equal(out.token_counts, ref.token_counts)
    for a, b in zip(out.token_index, ref.token_index):
        assert torch.equal(a, b)
    assert float((out.logits - ref.logits).abs().max()) <= 1e-5 * float(ref.logits.abs().max())


@pytest.mark.parametrize("dtype", ["fp16", "fp16-all"])
def test_block_engine_half_recipes(vit, images, dtype: str) -> None:
    model = apply_dtype(vit, dtype)
    spec = SPECS["cls-mass"]
    with torch.no_grad():
        ref = PrunedViT(model, spec, capacity=True)(images)
        out = PrunedViT(model, spec, capacity=True, engine="block")(images)
    assert torch.equal(out.token_counts, ref.token_counts)
    assert float((out.logits.float() - ref.logits.float()).abs().max()) <= 1e-2 * float(ref.logits.abs().max())


def test_unsupported_blocks_keep_the_ops(vit, images, monkeypatch) -> None:
    """A block the op cannot compute (tanh GELU here) runs its ops; the others still take the op."""
    import copy

    model = copy.deepcopy(vit)
    model.blocks[2].mlp.act = torch.nn.GELU(approximate="tanh")
    calls = _counted(monkeypatch)
    with torch.no_grad():
        ref = PrunedViT(model, SPECS["topk-l2"])(images)
        out = PrunedViT(model, SPECS["topk-l2"], engine="block")(images)
    assert calls[0] == 3
    assert float((out.logits - ref.logits).abs().max()) <= 1e-5 * float(ref.logits.abs().max())


def test_engine_argument_is_checked(vit) -> None:
    with pytest.raises(ValueError, match="engine must be one of ops, block"):
        PrunedViT(vit, SPECS["topk-l2"], engine="fast")


def test_other_families_refuse_the_block_engine() -> None:
    from timm.models.beit import Beit

    beit = Beit(img_size=32, patch_size=16, embed_dim=32, depth=1, num_heads=2, num_classes=3).eval()
    with pytest.raises(ValueError, match="engine='block' needs a timm VisionTransformer; Beit runs as"):
        PrunedViT(beit, SPECS["topk-l2"], engine="block")
