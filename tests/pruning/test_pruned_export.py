"""torch.export of the packed pruned ViT: data-dependent token counts, no host reads."""

from __future__ import annotations

import pytest
import torch
from _pruning_models import get_images, get_model

from raggedvit.pruning import PrunedViT, PruneSpec
from tests.support.testing import assert_close


@pytest.mark.usefixtures("no_grad")
@pytest.mark.parametrize(
    "spec",
    [
        PruneSpec("cls-mass", prune_at=(1, 3), mass=0.7),
        PruneSpec("evit", prune_at=(2,), keep=0.5, fuse=True),
    ],
    ids=["cls-mass", "evit-fuse"],
)
def test_export_with_data_dependent_token_count(spec: PruneSpec) -> None:
    vit = get_model("deit_tiny_d4")
    model = PrunedViT(vit, spec).eval()
    first = get_images("deit_tiny_d4", ("chelsea", "coffee"))
    second = get_images("deit_tiny_d4", ("rocket", "astronaut"))
    program = torch.export.export(model, (first,))
    assert "ragged_attention" in str(program.graph_module.code)
    run = program.module()
    for images in (first, second):
        got, want = run(images), model(images)
        assert_close(got.logits, want.logits, rtol=1e-5, atol=1e-5, name="exported logits")
        assert torch.equal(got.token_counts, want.token_counts)
        for a, b in zip(got.token_index, want.token_index):
            assert torch.equal(a, b)
    if spec.policy == "cls-mass":  # the count is data-dependent, not baked in at export time
        assert not torch.equal(run(first).token_counts, run(second).token_counts)
