"""The token-merging bars on a serving run's `--tome` file: tome's GPU time against its FLOPs, and its speed
against the unpruned export, at every batch the file holds.

    python3 -m benchmarks.tome_targets benchmarks/results/serving_tome_<gpu>.json   # adds "tome_targets", prints

Bars (ORT exports run as CUDA graphs, fp16-all, GPU time per image from the serving records' CUPTI sums):
  - B >= 32: tome's GPU time per image <= 1.15 x (its FLOPs / the unpruned FLOPs) x the unpruned export's;
  - B = 1: tome's img/s >= the unpruned export's;
  - r = 16, B >= 32: img/s >= 1.5 x the unpruned export's.
FLOPs: raggedvit.pruning.flops.image_flops with tome's per-block counts (merged_count; the merge inside the block:
its attention on the rows before it), on the timm model the file names with its model_kwargs (no weights needed).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["evaluate", "flops_ratio", "main"]

SLACK = 1.15
R16_SPEEDUP = 1.5


def flops_ratio(model: str, r: int, model_kwargs: dict[str, Any] | None = None) -> float:
    """FLOPs of tome r in every block over the unpruned forward, one image of `model` (a short name: deit_small;
    model_kwargs: timm's, as the run used them)."""
    import timm
    import torch

    from raggedvit.pruning import backbone_for
    from raggedvit.pruning.flops import image_flops, unpruned_flops
    from raggedvit.pruning.spec import merged_count

    name = f"{model}_patch16_224" if "_patch" not in model else model
    vit = timm.create_model(name, pretrained=False, **(model_kwargs or {})).eval()
    bb = backbone_for(vit)
    n, counts = bb.tokens_per_image(), []
    for _ in range(bb.depth):
        n -= merged_count(n, bb.num_prefix, r)
        counts.append(n)
    tome = image_flops(bb, tuple(range(bb.depth)), torch.tensor([counts], dtype=torch.float64), inside=True)
    return float(tome[0]) / unpruned_flops(bb)


def _r(policy: str) -> int | None:
    head, *fields = policy.split(":")
    return next((int(f[2:]) for f in fields if f.startswith("r=")), None) if head == "tome" else None


def evaluate(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (model, tome policy, batch): the measured figures and each bar's verdict."""
    recs = [r for r in data["records"] if r.get("status") == "ok" and r["variant"] in ("ort_unpruned", "ort_raggedvit")]
    base = {(r["model"], r["batch"]): r for r in recs if r["variant"] == "ort_unpruned"}
    kwargs = (data.get("config") or {}).get("model_kwargs") or {}
    ratios: dict[tuple[str, int], float] = {}
    rows = []
    for rec in recs:
        r = _r(rec["policy"])
        if r is None or (rec["model"], rec["batch"]) not in base:
            continue
        key = (rec["model"], r)
        if key not in ratios:
            ratios[key] = flops_ratio(*key, kwargs)
        unp = base[(rec["model"], rec["batch"])]
        row = {
            "model": rec["model"],
            "r": r,
            "batch": rec["batch"],
            "flops_ratio": round(ratios[key], 4),
            "gpu_us_per_image": rec["gpu_us_per_image"],
            "unpruned_gpu_us_per_image": unp["gpu_us_per_image"],
            "speedup_img_per_s": round(rec["img_per_s"] / unp["img_per_s"], 3),
            "mode": rec.get("mode"),
        }
        bars = {}
        if rec["batch"] >= 32:
            if rec["gpu_us_per_image"] is None or unp["gpu_us_per_image"] is None:  # no CUDA profile (a CPU run)
                bars["gpu_time_vs_flops"] = {"limit_us": None, "met": False, "why_not": "no GPU time measured"}
            else:
                limit = SLACK * ratios[key] * unp["gpu_us_per_image"]
                bars["gpu_time_vs_flops"] = {"limit_us": round(limit, 2), "met": rec["gpu_us_per_image"] <= limit}
            if r == 16:
                bars["r16_speedup"] = {"limit": R16_SPEEDUP, "met": row["speedup_img_per_s"] >= R16_SPEEDUP}
        if rec["batch"] == 1:
            bars["not_slower_at_b1"] = {"met": rec["img_per_s"] >= unp["img_per_s"]}
        row["bars"] = bars
        rows.append(row)
    return rows


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", type=Path)
    args = parser.parse_args(argv)
    data = json.loads(args.file.read_text())
    data["tome_targets"] = evaluate(data)
    args.file.write_text(json.dumps(data, indent=1) + "\n")
    for row in data["tome_targets"]:
        verdicts = ", ".join(f"{k} {'met' if v['met'] else 'MISSED'}" for k, v in row["bars"].items())
        print(
            f"{row['model']} r={row['r']} B={row['batch']}: {_us(row['gpu_us_per_image'])} us/img "
            f"(unpruned {_us(row['unpruned_gpu_us_per_image'])}, FLOPs x{row['flops_ratio']:.3f}), "
            f"{row['speedup_img_per_s']:.2f}x img/s; {verdicts}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
