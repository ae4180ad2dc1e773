"""Policy evit in PrunedViT equals EViT as its published code runs it (tests/support/evit_reference.py, written from
youweiliang/evit): the stage inside the block after the attention residual, ranked by that block's class attention,
ceil(keep * (N - 1)) tokens kept, the fused token the attention-weighted sum of the dropped ones (not renormalised)
before the MLP. Seeded weights (q/k x4) and sample photos: agreement says nothing about accuracy on trained ones."""

from __future__ import annotations

import pytest
import torch
from _pruning_models import get_images, get_model

from raggedvit.pruning import PrunedViT, PruneSpec
from tests.support.evit_reference import FUSED, evit_reference_forward
from tests.support.testing import assert_close

CASES = [  # (model, keep, drop_loc, fuse): EViT's published schedules on DeiT-T / DeiT-S
    ("deit_tiny", 0.7, (3, 6, 9), False),
    ("deit_tiny", 0.7, (3, 6, 9), True),
    ("deit_small", 0.7, (3, 6, 9), True),
    ("deit_small", 0.5, (3, 6, 9), False),
    ("deit_tiny", 0.6, (0, 4, 11), True),  # the first and the last block
]


def _kept_sets(index: torch.Tensor, cu: torch.Tensor) -> list[list[int]]:
    """Per image, the sorted original token indices of one stage's rows (FUSED for a fused token)."""
    return [sorted(index[int(a) : int(b)].tolist()) for a, b in zip(cu[:-1], cu[1:])]


@pytest.mark.usefixtures("no_grad")
@pytest.mark.parametrize(("model_key", "keep", "drop_loc", "fuse"), CASES)
@pytest.mark.parametrize("capacity", [False, True], ids=["compact", "capacity"])
def test_evit_equals_evit(model_key, keep, drop_loc, fuse, capacity) -> None:
    vit, images = get_model(model_key), get_images(model_key, ("chelsea", "astronaut"))
    spec = PruneSpec("evit", drop_loc, keep=keep, fuse=fuse)
    out = PrunedViT(vit, spec, capacity=capacity)(images)
    ref = evit_reference_forward(vit, images, keep, drop_loc, fuse_token=fuse)
    assert out.token_counts.tolist() == ref.counts.tolist()
    for s, (index, cu) in enumerate(zip(out.token_index, out.cu_seqlens)):
        expect = [sorted(row.tolist()) for row in ref.kept_index[s]]  # EViT orders by attention, raggedvit by position
        assert _kept_sets(index, cu) == expect, f"stage {s}"
    assert_close(out.logits, ref.logits, rtol=1e-5, atol=1e-5, name=f"{model_key} evit keep={keep} fuse={fuse}")


@pytest.mark.usefixtures("no_grad")
def test_the_fused_token_is_a_plain_weighted_sum() -> None:
    """Renormalising the fused token (dividing by the dropped attention's sum) is caught: the logits move far past
    the tolerance above."""
    vit, images = get_model("deit_tiny"), get_images("deit_tiny", ("chelsea", "astronaut"))
    ref = evit_reference_forward(vit, images, 0.7, fuse_token=True)
    out = PrunedViT(vit, PruneSpec("evit", (3, 6, 9), keep=0.7, fuse=True))(images)
    assert int((out.token_index[0] == FUSED).sum()) == images.shape[0]
    assert_close(out.logits, ref.logits, rtol=1e-5, atol=1e-5, name="fused")
    plain = PrunedViT(vit, PruneSpec("evit", (3, 6, 9), keep=0.7))(images).logits
    assert float((plain - ref.logits).abs().max()) > 1e-3 * float(ref.logits.abs().max())


@pytest.mark.usefixtures("no_grad")
def test_evit_runs_the_pruning_blocks_mlp_on_the_kept_rows_only(monkeypatch) -> None:
    """The MLP of a pruning block sees p + k (+ fused) rows, not the block's input rows."""
    vit, images = get_model("deit_tiny"), get_images("deit_tiny", ("chelsea",))
    rows: list[int] = []
    mlp = vit.blocks[3].mlp
    handle = mlp.register_forward_hook(lambda m, inp, out: rows.append(inp[0].shape[0]))
    try:
        PrunedViT(vit, PruneSpec("evit", (3,), keep=0.5, fuse=True))(images)
    finally:
        handle.remove()
    assert rows == [1 + 98 + 1]


def test_a_keep_that_drops_nothing_fuses_nothing() -> None:
    """EViT returns early when ceil(keep * (N - 1)) keeps every token: no fused token is made."""
    vit, images = get_model("deit_tiny_d3"), get_images("deit_tiny_d3", ("chelsea",))
    with torch.no_grad():
        out = PrunedViT(vit, PruneSpec("evit", (1,), keep=0.999, fuse=True))(images)
        ref = evit_reference_forward(vit, images, 0.999, (1,), fuse_token=True)
    assert out.token_counts.tolist() == ref.counts.tolist() == [[197]]
    assert_close(out.logits, ref.logits, rtol=1e-5, atol=1e-5, name="no drop")
