"""A sweep's grid: text and mapping forms, the keys of each policy, and the refusals."""

from __future__ import annotations

import pytest

from raggedvit.policies import POLICIES, POLICY_PARAMS
from raggedvit.pruning import PruneSpec
from raggedvit.sweep import SweepInputError, grid_keys, grid_points, parse_grid, point_label


def test_parse_grid_values_and_block_alternatives() -> None:
    assert parse_grid("topk-l2", "keep=0.3,0.5,0.7 at=3,6,9|4") == {"keep": [0.3, 0.5, 0.7], "at": [(3, 6, 9), (4,)]}
    assert parse_grid("evit", " keep=0.5  fuse=true,off ") == {"keep": [0.5], "fuse": [True, False]}


def test_grid_points_are_every_combination_in_order() -> None:
    points = grid_points("topk-l2", "keep=0.3,0.5 at=3,6,9|4")
    assert points == [
        PruneSpec("topk-l2", (3, 6, 9), keep=0.3),
        PruneSpec("topk-l2", (4,), keep=0.3),
        PruneSpec("topk-l2", (3, 6, 9), keep=0.5),
        PruneSpec("topk-l2", (4,), keep=0.5),
    ]
    assert [point_label(p) for p in points[:2]] == ["topk-l2 keep=0.3 at=3,6,9", "topk-l2 keep=0.3 at=4"]
    # a missing key takes PruneSpec.from_strings' default (at: block 4); repeats are dropped
    assert grid_points("cls-mass", "mass=0.8,0.8") == [PruneSpec("cls-mass", (4,), mass=0.8)]
    fused = grid_points("evit", {"keep": [0.5], "fuse": [True], "at": [[3]]})
    assert (
        fused == [PruneSpec("evit", (3,), keep=0.5, fuse=True)] and point_label(fused[0]) == "evit keep=0.5 fuse at=3"
    )
    assert grid_points("none", "") == [PruneSpec()] and point_label(PruneSpec()) == "none"


def test_every_policy_has_grid_keys() -> None:
    """The keys come from the policy definitions: every policy is listed, and each key is a PruneSpec field."""
    missing = set(POLICIES) - set(POLICY_PARAMS)
    assert not missing, f"name the PruneSpec fields of {sorted(missing)} in raggedvit.policies.POLICY_PARAMS"
    assert set(POLICY_PARAMS) <= set(POLICIES)
    fields = set(PruneSpec.__dataclass_fields__)
    for policy in POLICIES:
        keys = grid_keys(policy)
        assert ("at" in keys) == (policy != "none")
        assert {k for k in keys if k != "at"} <= fields


@pytest.mark.parametrize(
    ("policy", "grid", "message"),
    [
        ("topk-l2", "", "--grid for topk-l2 is empty"),
        ("topk-l2", "   ", "is empty"),
        ("topk-l2", "mass=0.9", "unknown key 'mass'; topk-l2 takes keep, at"),
        ("cls-mass", "keep=0.5", "unknown key 'keep'; cls-mass takes mass, at"),
        ("topk-l2", "keep=0.5 keep=0.7", "keep is given twice"),
        ("topk-l2", "keep", "'keep' is not KEY=VALUES"),
        ("topk-l2", "keep=", "keep has an empty value"),
        ("topk-l2", "keep=0.5,,0.7", "keep has an empty value"),
        ("topk-l2", "at=3||6", "at has an empty value"),
        ("topk-l2", "keep=half", "keep takes float values, got 'half'"),
        ("evit", "fuse=maybe", "fuse takes bool values"),
        ("topk-l2", "at=3,x", "at takes comma-separated block indices"),
        ("topk-l2", "keep=1.5", "--grid for topk-l2: keep=1.5: keep must be in (0, 1]"),
        ("topk-l2", "at=6,3", "at=6,3: prune indices must be strictly increasing"),
        ("bogus", "keep=0.5", "unknown policy 'bogus'"),
    ],
)
def test_bad_grids_are_refused_with_one_line(policy: str, grid: str, message: str) -> None:
    with pytest.raises(SweepInputError) as info:
        grid_points(policy, grid)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_mapping_grid_refusals() -> None:
    with pytest.raises(SweepInputError, match="unknown key 'r'"):
        grid_points("topk-l2", {"r": [8]})
    with pytest.raises(SweepInputError, match="empty"):
        grid_points("topk-l2", {"keep": []})


def test_a_tome_point_measures_its_accuracy_side() -> None:
    """grid 'r=8,16' of tome (every block by default): PrunedViT runs it and the FLOPs count each merge inside its
    block (attention on the rows before the merge), below the unpruned forward's."""
    import math

    from raggedvit.images import sample_images
    from raggedvit.pruning import backbone_for
    from raggedvit.sweep.inputs import SweepImages
    from raggedvit.sweep.measure import measure_accuracy, reference
    from raggedvit.weights import load_vit

    vit, _ = load_vit("deit_tiny_patch16_224", seed=0, img_size=64, model_kwargs={"depth": 2})
    photos = [image for _, image in sample_images()[:3]]
    images = SweepImages(("a", "b", "c"), None, "sample photos", photos.__getitem__)
    ref = reference(vit, images, batch=3, device="cpu")
    points = grid_points("tome", "r=2,8")
    assert [p.r for p in points] == [2, 8] and all(p.prune_at == () for p in points)
    assert [point_label(p) for p in points] == ["tome r=2", "tome r=8"]
    assert point_label(grid_points("tome", "r=4 at=0,1")[0]) == "tome r=4 at=0,1"
    results = [measure_accuracy(vit, backbone_for(vit), p, images, ref, batch=3, device="cpu") for p in points]
    assert [r["tokens"] for r in results] == [[15.0, 13.0], [9.0, 5.0]]  # 17 tokens: 16 patches and a class token
    assert all(0 < r["flops_ratio"] < 1 and math.isfinite(r["kl"]) for r in results)


def test_equal_points_are_tome_points_that_merge_alike() -> None:
    """deit at 224 px: 196 patch tokens and the class token in 12 blocks. From r=98 on every r merges half the patch
    tokens in each block (merged_count), the same model: 301 points, 99 of them different. In blocks 3 and 6 only,
    r=98 and r=99 both merge 98 then 49; r=49, 50, 60 merge r twice, each another model. Other policies: none."""
    from raggedvit.sweep.grid import equal_points, point_key

    deit = {"depth": 12, "tokens": 197, "num_prefix": 1}
    specs = [PruneSpec(), *grid_points("tome", "r=" + ",".join(str(r) for r in range(1, 301)))]
    same = equal_points(specs, **deit)
    r98 = point_key(PruneSpec("tome", r=98))
    assert len(specs) == 301 and set(same.values()) == {r98} and len(same) == 300 - 98
    assert len(equal_points(grid_points("tome", "r=49,50,60,99 at=3,6"), **deit)) == 0
    assert len(equal_points(grid_points("tome", "r=98,99 at=3,6"), **deit)) == 1
    keeps = grid_points("topk-l2", "keep=0.99,0.995,1")  # the same counts at 196 patches: not tome, not merged
    assert equal_points(keeps, **deit) == {}
