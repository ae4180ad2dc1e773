"""PruneSpec parsing, validation and metadata round trip."""

from __future__ import annotations

import pytest
import timm
import torch

from raggedvit.pruning import PrunedViT, PruneSpec
from raggedvit.weights import load_vit


def test_from_strings_parses_cli_values() -> None:
    spec = PruneSpec.from_strings("evit", "3, 6,9", keep="0.7", fuse=True)
    assert spec == PruneSpec("evit", prune_at=(3, 6, 9), keep=0.7, mass=0.9, fuse=True)
    assert spec.num_stages == 3 and spec.needs_cls_attn
    assert PruneSpec.from_strings("topk-l2", 4).prune_at == (4,)
    assert PruneSpec.from_strings("none", "4").prune_at == ()  # "none" has no stages


def test_dict_round_trip() -> None:
    spec = PruneSpec("cls-mass", prune_at=(2, 5), mass=0.75)
    d = spec.to_dict()
    assert d == {"policy": "cls-mass", "prune_at": [2, 5], "keep": 0.5, "mass": 0.75, "fuse": False}
    assert PruneSpec.from_dict(d) == spec
    with pytest.raises(ValueError, match="unknown PruneSpec fields"):
        PruneSpec.from_dict({**d, "ratio": 1})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"policy": "random"}, "unknown pruning policy 'random'"),
        ({"policy": "topk-l2", "prune_at": "4,4"}, "strictly increasing"),
        ({"policy": "topk-l2", "prune_at": "6,3"}, "strictly increasing"),
        ({"policy": "topk-l2", "prune_at": "0"}, ">= 1"),
        ({"policy": "topk-l2", "prune_at": ""}, "at least one prune index"),
        ({"policy": "topk-l2", "prune_at": "a,b"}, "comma-separated block indices"),
        ({"policy": "topk-l2", "keep": 0.0}, r"keep must be in \(0, 1\]"),
        ({"policy": "topk-l2", "keep": 1.5}, r"keep must be in \(0, 1\]"),
        ({"policy": "cls-mass", "mass": -0.1}, r"mass must be in \(0, 1\]"),
        ({"policy": "cls-mass", "mass": float("nan")}, r"mass must be in \(0, 1\]"),
        ({"policy": "topk-l2", "fuse": True}, "fuse is only defined for policy 'evit'"),
        ({"policy": "topk-l2", "prune_at": "12", "depth": 12}, r"prune index 12 out of range 1\.\.11"),
        ({"policy": "evit", "has_class_token": False}, "needs a class token"),
        ({"policy": "cls-mass", "has_class_token": False}, "needs a class token"),
    ],
)
def test_validation_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        PruneSpec.from_strings(**kwargs)
    assert "\n" not in str(info.value)


def test_pruned_vit_checks_the_model() -> None:
    vit, _ = load_vit("vit_wee_patch16_reg1_gap_256", model_kwargs={"depth": 2})  # no class token
    with pytest.raises(ValueError, match="needs a class token"):
        PrunedViT(vit, PruneSpec("evit", prune_at=(1,)))
    with pytest.raises(ValueError, match=r"out of range 1\.\.1"):
        PrunedViT(vit, PruneSpec("topk-l2", prune_at=(2,)))
    PrunedViT(vit, PruneSpec("topk-l2", prune_at=(1,)))  # fine


def test_unsupported_pooling_and_model() -> None:
    vit = timm.create_model("deit_tiny_patch16_224", depth=2, global_pool="prr")
    with pytest.raises(ValueError, match="attention pooling AttentionPoolPrr"):
        PrunedViT(vit, PruneSpec())
    with pytest.raises(ValueError, match="not a ViT raggedvit runs: attention pooling AttentionPoolPrr"):
        load_vit("deit_tiny_patch16_224", model_kwargs={"depth": 2, "global_pool": "prr"})
    with pytest.raises(ValueError, match="expected a timm .*VisionTransformer.*, got Linear$"):
        PrunedViT(torch.nn.Linear(2, 2), PruneSpec())  # type: ignore[arg-type]


def test_an_evit_spec_from_before_the_in_block_placement_is_refused() -> None:
    """evit's stages moved inside their blocks (EViT's placement): its dicts say so, and a recipe without the marker
    (an export of the earlier meaning, stages before block i) is refused by name rather than validated against the
    other model."""
    spec = PruneSpec("evit", (3, 6, 9), keep=0.7, fuse=True)
    assert spec.to_dict()["placement"] == "inside" and PruneSpec.from_dict(spec.to_dict()) == spec
    assert "placement" not in PruneSpec("topk-l2", (4,)).to_dict()
    old = {k: v for k, v in spec.to_dict().items() if k != "placement"}
    with pytest.raises(ValueError, match="an evit spec written before its stages ran inside their blocks"):
        PruneSpec.from_dict(old)
