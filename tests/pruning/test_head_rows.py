"""The last block on the rows the head reads (Backbone.head_rows): token pooling runs proj / norm2 / MLP of the last
block on each image's class (and distillation) row alone; the logits are the full block's."""

from __future__ import annotations

import pytest
import torch
from _pruning_models import get_images, get_model

from raggedvit.pruning import PrunedViT, PruneSpec
from raggedvit.pruning.families.vit import ViTBackbone

SPECS = {
    "topk-l2": PruneSpec("topk-l2", keep=0.5, prune_at=(1,)),
    "cls-mass": PruneSpec("cls-mass", mass=0.9, prune_at=(1, 2)),
    "none": PruneSpec("none"),
}


def _last_mlp_rows(pruned: PrunedViT, images: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(logits, rows the last block's MLP ran on)."""
    seen: list[int] = []
    hook = pruned.backbone.blocks[-1].mlp.register_forward_hook(lambda _m, args, _o: seen.append(args[0].shape[0]))
    try:
        logits = pruned(images).logits
    finally:
        hook.remove()
    assert len(seen) == 1
    return logits, seen[0]


@pytest.mark.parametrize(("key", "per_image"), [("deit_tiny_d4", 1), ("deit_tiny_distilled", 2), ("dinov2_reg4", 1)])
@pytest.mark.parametrize("policy", ["topk-l2", "cls-mass", "none"])
@pytest.mark.parametrize("capacity", [False, True], ids=["compact", "capacity"])
def test_token_pooling_runs_the_last_block_tail_on_head_rows(no_grad, monkeypatch, key, per_image, policy, capacity):
    model, images = get_model(key), get_images(key)
    spec = SPECS[policy]
    logits, rows = _last_mlp_rows(PrunedViT(model, spec, capacity=capacity), images)
    assert rows == per_image * images.shape[0]
    # the same model with every row through the last block (no head rows): the same logits
    monkeypatch.setattr(ViTBackbone, "head_rows", lambda self, state: None)
    full, all_rows = _last_mlp_rows(PrunedViT(model, spec, capacity=capacity), images)
    assert all_rows > rows
    torch.testing.assert_close(logits, full, rtol=1e-5, atol=1e-5)


def test_mean_pooling_keeps_every_row(no_grad):
    model, images = get_model("wee_reg1_gap"), get_images("wee_reg1_gap")
    pruned = PrunedViT(model, PruneSpec("topk-l2", keep=0.5, prune_at=(1,)))
    assert pruned.backbone.head_rows(None) is None  # avg pooling reads every row: no state needed to say so
    _, rows = _last_mlp_rows(pruned, images)
    n = pruned.backbone.tokens_per_image()
    p = pruned.num_prefix
    assert rows == images.shape[0] * (p + -(-(n - p) // 2))  # every kept row: ceil((n - p) / 2) patches + prefix
