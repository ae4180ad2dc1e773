"""Markdown tables for the README from a benchmarks.e2e results JSON.

    python3 -m benchmarks.readme_table benchmarks/results/e2e_<gpu>.json > table.md

One table per model x image size: rows = variants (pruned ones per policy, with the mean tokens per image
after each stage at the largest batch), columns = batch sizes, cells = images/s ("err" / "skip" when the run
recorded no timing); then the speedups of raggedvit in ORT (the faster of ort_raggedvit and its CUDA-graph
replay ort_raggedvit_graph) over the best unpruned variant (timm eager, ORT fp16, ORT fp16
optimized), over every unpruned variant including the optimized one replayed as a CUDA graph, and over
torch_padded_sdpa.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.e2e.names import BASELINES, PRUNED
from benchmarks.e2e.report import speedups


def _cell(rec: dict[str, Any] | None) -> str:
    if rec is None:
        return ""
    if rec.get("status") != "ok":
        return "err" if rec.get("status") == "error" else "skip"
    v = rec["img_per_s"]
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def _tokens(records: list[dict[str, Any]], model: str, size: int, policy: str) -> str:
    for variant in ("torch_raggedvit", "ort_raggedvit", "torch_padded_sdpa"):
        for r in sorted(records, key=lambda r: -r["batch"]):  # the largest batch: mean over most images
            if (r["model"], r["img_size"], r["policy"], r["variant"]) == (model, size, policy, variant):
                if r.get("mean_tokens"):
                    return " → ".join(f"{t:g}" for t in r["mean_tokens"])
    return ""


def markdown(results: dict[str, Any]) -> str:
    records = results["records"]
    policies = list(results.get("config", {}).get("policies") or dict.fromkeys(r["policy"] for r in records))
    policies = [p for p in policies if p != "none"]
    ratios = results.get("speedups") or speedups(records, policies)
    index = {(r["model"], r["img_size"], r["policy"], r["variant"], r["batch"]): r for r in records}
    rat = {(r["model"], r["img_size"], r["batch"], r["policy"]): r for r in ratios}
    lines = [
        f"End-to-end images/s on {results.get('gpu')} (driver {results.get('driver')}), "
        f"torch {results.get('torch')}, triton {results.get('triton')}, onnxruntime {results.get('onnxruntime')}, "
        f"timm {results.get('timm')}; {results.get('date')}; torch dtype {results.get('config', {}).get('dtype')}, "
        f"raggedvit export {results.get('config', {}).get('export_dtype') or results.get('config', {}).get('dtype')}"
        f" (commit {results.get('raggedvit_commit')}).",
        "",
    ]
    for model, size in sorted({(r["model"], r["img_size"]) for r in records}):
        batches = sorted({r["batch"] for r in records if (r["model"], r["img_size"]) == (model, size)})
        lines += [f"**{model} {size}px**", ""]
        lines.append(
            "| variant | policy | mean tokens/image after each stage | " + " | ".join(f"B={b}" for b in batches) + " |"
        )
        lines.append("|---|---|---|" + "---:|" * len(batches))
        rows = [(v, "none") for v in BASELINES] + [(v, p) for p in policies for v in PRUNED]
        for variant, pol in rows:
            cells = [_cell(index.get((model, size, pol, variant, b))) for b in batches]
            if not any(cells):
                continue
            tokens = _tokens(records, model, size, pol) if pol != "none" else ""
            lines.append(f"| {variant} | {pol} | {tokens} | " + " | ".join(cells) + " |")
        for pol in policies:
            for key, label in (
                ("speedup_vs_best_unpruned", "best unpruned (eager, ort, ort opt)"),
                ("speedup_vs_best_unpruned_incl_graph", "best unpruned incl. ort opt CUDA graph"),
                ("speedup_vs_padded", "padded SDPA"),
            ):
                vals = [rat.get((model, size, b, pol), {}).get(key) for b in batches]
                if any(v is not None for v in vals):
                    shown = [f"**{v:.2f}×**" if v is not None else "" for v in vals]
                    lines.append(f"| raggedvit ORT / {label} | {pol} |  | " + " | ".join(shown) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", help="e2e_<gpu>.json written by python3 -m benchmarks.e2e")
    args = ap.parse_args()
    path = Path(args.results)
    try:
        results = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        sys.exit(f"cannot read {path}: {exc}")
    if not isinstance(results, dict) or "records" not in results:
        sys.exit(f"{path} is not a benchmarks.e2e results file (no 'records')")
    print(markdown(results))


if __name__ == "__main__":
    main()
