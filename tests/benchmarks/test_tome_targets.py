"""benchmarks.tome_targets: the token-merging bars judged on a serving file's records (synthetic records here; the
FLOPs ratio from raggedvit.pruning.flops on timm's deit_small)."""

from __future__ import annotations

import pytest

from benchmarks.tome_targets import evaluate, flops_ratio


def _rec(variant: str, policy: str, batch: int, img_per_s: float, gpu_us: float) -> dict:
    return {"model": "deit_small", "variant": variant, "policy": policy, "batch": batch, "status": "ok",
            "img_per_s": img_per_s, "gpu_us_per_image": gpu_us, "mode": "cuda_graph"}  # fmt: skip


def test_flops_ratio_follows_the_merged_counts():
    r8, r16 = flops_ratio("deit_small", 8), flops_ratio("deit_small", 16)
    assert 0.70 < r8 < 0.78 and 0.45 < r16 < 0.55 and r16 < r8


def test_each_bar_is_judged_at_its_batches():
    r8 = flops_ratio("deit_small", 8)
    recs = [
        _rec("ort_unpruned", "none", 1, 1000.0, 100.0),
        _rec("ort_raggedvit", "tome:r=8", 1, 900.0, 95.0),  # slower at batch 1: missed
        _rec("ort_unpruned", "none", 32, 10000.0, 100.0),
        _rec("ort_raggedvit", "tome:r=8", 32, 12000.0, 1.15 * r8 * 100.0 - 0.01),  # just inside 1.15 x FLOPs
        _rec("ort_raggedvit", "tome:r=16", 32, 14000.0, 60.0),  # 1.4x img/s: the r=16 bar missed
        _rec("ort_raggedvit", "topk-l2:keep=0.507653:at=4", 32, 13000.0, 70.0),  # not a tome row
    ]
    rows = {(r["r"], r["batch"]): r for r in evaluate({"records": recs})}
    assert set(rows) == {(8, 1), (8, 32), (16, 32)}
    assert rows[(8, 1)]["bars"] == {"not_slower_at_b1": {"met": False}}
    assert rows[(8, 32)]["bars"]["gpu_time_vs_flops"]["met"] is True
    assert rows[(16, 32)]["bars"]["r16_speedup"] == {"limit": 1.5, "met": False}
    assert rows[(16, 32)]["speedup_img_per_s"] == pytest.approx(1.4)
