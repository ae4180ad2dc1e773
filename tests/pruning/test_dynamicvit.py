"""Policy dynamicvit: PrunedViT built from a DynamicViT checkpoint (build_pruned_vit) equals DynamicViT as its
published code runs it (tests/support/dynamicvit_reference.py, written from raoyongming/DynamicViT): before blocks
3, 6, 9 the stage's predictor scores the patch rows and int(P * rho^(s+1)) of them stay. Seeded weights and a seeded
predictor: agreement says nothing about accuracy on trained ones."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from _pruning_models import MODELS, get_images, get_model

from raggedvit.pruning import PolicyStateError, PrunedViT, PruneSpec, build_pruned_vit, policy_state
from raggedvit.weights import load_vit
from tests.support.dynamicvit_reference import (
    dynamicvit_checkpoint,
    dynamicvit_keep_counts,
    dynamicvit_reference_forward,
    split_dynamicvit_checkpoint,
)
from tests.support.testing import assert_close


@functools.cache
def _checkpoint(model_key: str, tmp: Path, bare: bool = False) -> Path:
    """A DynamicViT checkpoint of the seeded model: {"model": backbone + predictors} (or the bare state dict)."""
    ckpt = dynamicvit_checkpoint(get_model(model_key), seed=1)
    path = tmp / f"{model_key}{'-bare' if bare else ''}.pth"
    torch.save(ckpt["model"] if bare else ckpt, path)
    return path


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("dynamicvit")


def _load(model_key: str, path: Path):
    name, kwargs = MODELS[model_key]
    vit, _ = load_vit(name, checkpoint=path, **{k: v for k, v in kwargs.items() if k != "seed"})
    return vit


@pytest.mark.usefixtures("no_grad")
@pytest.mark.parametrize(("model_key", "rho", "bare"), [("deit_tiny", 0.7, False), ("deit_small", 0.7, True),
                                                        ("deit_tiny", 0.5, True)])  # fmt: skip
def test_dynamicvit_equals_dynamicvit(ckpt_dir, model_key, rho, bare) -> None:
    path = _checkpoint(model_key, ckpt_dir, bare)
    vit, images = _load(model_key, path), get_images(model_key, ("chelsea", "astronaut"))
    _, predictor = split_dynamicvit_checkpoint(torch.load(path, weights_only=True))
    assert sorted(policy_state(vit)) == sorted(predictor)  # set apart from the backbone, kept with the model
    out = build_pruned_vit(vit, PruneSpec("dynamicvit", (3, 6, 9), keep=rho))(images)
    ref = dynamicvit_reference_forward(vit, predictor, images, rho)
    P = vit.patch_embed.num_patches
    assert out.token_counts.tolist() == ref.counts.tolist()
    assert [c - 1 for c in out.token_counts[0].tolist()] == list(dynamicvit_keep_counts(P, rho))
    for s, (index, cu) in enumerate(zip(out.token_index, out.cu_seqlens)):
        got = [sorted(index[int(a) : int(b)].tolist()) for a, b in zip(cu[:-1], cu[1:])]
        assert got == [sorted(row.tolist()) for row in ref.kept_index[s]], f"stage {s}"  # DynamicViT: score order
    assert_close(out.logits, ref.logits, rtol=1e-5, atol=1e-5, name=f"{model_key} dynamicvit rho={rho}")


@pytest.mark.usefixtures("no_grad")
def test_the_predictor_sees_patch_rows_and_averages_their_global_half(ckpt_dir) -> None:
    """The wrong stage's predictor, or the global half not averaged, changes the kept rows (mutants the
    reference catches)."""
    vit, images = _load("deit_tiny", _checkpoint("deit_tiny", ckpt_dir)), get_images("deit_tiny", ("chelsea",))
    spec = PruneSpec("dynamicvit", (3, 6, 9), keep=0.7)
    good = build_pruned_vit(vit, spec)(images)
    state = policy_state(vit)
    swapped = {k.replace("score_predictor.0.", "score_predictor.X.").replace("score_predictor.1.", "score_predictor.0.")
               .replace("score_predictor.X.", "score_predictor.1."): v for k, v in state.items()}  # fmt: skip
    wrong = build_pruned_vit(vit, spec, state=swapped)(images)
    assert sorted(wrong.token_index[0].tolist()) != sorted(good.token_index[0].tolist())


def test_a_checkpoint_without_predictor_keys_is_an_input_error() -> None:
    vit = get_model("deit_tiny")
    with pytest.raises(
        PolicyStateError,
        match=r"policy 'dynamicvit' needs its predictor weights in the checkpoint "
        r"\(3 stages under 'score_predictor.<stage>.'\); missing: score_predictor.0.in_conv.0.weight",
    ):
        build_pruned_vit(vit, PruneSpec("dynamicvit", (3, 6, 9)))  # fmt: skip
    with pytest.raises(ValueError, match="build the model with raggedvit.pruning.build_pruned_vit"):
        PrunedViT(vit, PruneSpec("dynamicvit", (3, 6, 9)))


def test_predictors_for_other_stages_are_refused(ckpt_dir) -> None:
    vit = _load("deit_tiny", _checkpoint("deit_tiny", ckpt_dir))
    with pytest.raises(
        PolicyStateError,
        match=r"runs 2 stages \(prune_at \[3, 6\]\); the checkpoint has predictor "
        r"keys of no stage: score_predictor.2.in_conv.0.bias",
    ):
        build_pruned_vit(vit, PruneSpec("dynamicvit", (3, 6)))  # fmt: skip


@pytest.mark.usefixtures("no_grad")
def test_a_dynamicvit_checkpoint_under_another_policy_loads_its_backbone(ckpt_dir) -> None:
    vit = _load("deit_tiny", _checkpoint("deit_tiny", ckpt_dir))
    images = get_images("deit_tiny", ("chelsea",))
    out = build_pruned_vit(vit, PruneSpec("topk-l2", (4,)))(images)
    assert_close(out.logits, PrunedViT(get_model("deit_tiny"), PruneSpec("topk-l2", (4,)))(images).logits, rtol=1e-6)
