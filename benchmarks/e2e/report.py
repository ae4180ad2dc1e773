"""Results of benchmarks.e2e: speedup ratios, the compact table, the PNG, atomic JSON writes."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.e2e.names import BASELINES, ISSUE_BASELINES, OURS, PRUNED

__all__ = ["compact_table", "plot", "profile_lines", "speedups", "write_json"]

_SHORT = {
    "timm_eager_fp16": "eager",
    "ort_fp16": "ort",
    "ort_fp16_optimized": "ort_opt",
    "ort_fp16_optimized_graph": "opt_cg",
    "torch_padded_sdpa": "pad",
    "torch_varlen": "varlen",
    "torch_raggedvit": "t_rv",
    "ort_raggedvit": "ort_rv",
    "ort_raggedvit_graph": "rv_cg",
}


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Write `payload` to `path` via a temporary file and rename (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1, default=str))
    os.replace(tmp, path)


def _ok(records: list[dict[str, Any]]) -> dict[tuple, float]:
    """(model, img_size, policy, variant, batch) -> img/s of the successful records."""
    return {
        (r["model"], r["img_size"], r["policy"], r["variant"], r["batch"]): r["img_per_s"]
        for r in records
        if r.get("status") == "ok" and r.get("img_per_s")
    }


def _best(values: dict[str, float | None]) -> tuple[str | None, float | None]:
    have = {v: x for v, x in values.items() if x}
    if not have:
        return None, None
    v = max(have, key=have.get)
    return v, have[v]


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def speedups(records: list[dict[str, Any]], policies: list[str]) -> list[dict[str, Any]]:
    """Per (model, img_size, batch, policy): the faster raggedvit ORT variant (per-node run or CUDA-graph replay)
    over the best unpruned variant of the speed bar (timm_eager_fp16, ort_fp16, ort_fp16_optimized), over every
    unpruned variant including the CUDA-graph replay of ort_fp16_optimized, and over torch_padded_sdpa."""
    ok = _ok(records)
    cases = sorted({(r["model"], r["img_size"], r["batch"]) for r in records})
    out = []
    for model, size, batch in cases:
        best_v, best = _best({v: ok.get((model, size, "none", v, batch)) for v in ISSUE_BASELINES})
        best_all_v, best_all = _best({v: ok.get((model, size, "none", v, batch)) for v in BASELINES})
        for pol in policies:
            ours_v, ours = _best({v: ok.get((model, size, pol, v, batch)) for v in OURS})
            padded = ok.get((model, size, pol, "torch_padded_sdpa", batch))
            out.append(
                {
                    "model": model,
                    "img_size": size,
                    "batch": batch,
                    "policy": pol,
                    "ours_variant": ours_v,
                    "ours_img_per_s": ours,
                    "ort_raggedvit_img_per_s": ok.get((model, size, pol, "ort_raggedvit", batch)),
                    "ort_raggedvit_graph_img_per_s": ok.get((model, size, pol, "ort_raggedvit_graph", batch)),
                    "best_unpruned_variant": best_v,
                    "best_unpruned_img_per_s": best,
                    "speedup_vs_best_unpruned": _ratio(ours, best),
                    "best_unpruned_incl_graph_variant": best_all_v,
                    "speedup_vs_best_unpruned_incl_graph": _ratio(ours, best_all),
                    "torch_padded_sdpa_img_per_s": padded,
                    "speedup_vs_padded": _ratio(ours, padded),
                }
            )
    return out


def _fmt(v: float | None, width: int = 7) -> str:
    if v is None:
        return f"{'-':>{width}}"
    return f"{v:>{width}.0f}" if v >= 100 else f"{v:>{width}.1f}"


def compact_table(records: list[dict[str, Any]], policies: list[str], ratios: list[dict[str, Any]]) -> str:
    """img/s per variant, one row per (model, size, batch); per policy a block of pruned variants + ratios."""
    ok = _ok(records)
    rat = {(r["model"], r["img_size"], r["batch"], r["policy"]): r for r in ratios}
    head = f"{'model':<11}{'px':>4}{'B':>5} " + "".join(f"{_SHORT[v]:>8}" for v in BASELINES)
    for i, _ in enumerate(policies):
        head += f" |P{i}" + "".join(f"{_SHORT[v]:>8}" for v in PRUNED) + f"{'x_best':>7}{'x_pad':>6}"
    lines = [
        "img/s (P<i> = policy i below; cg = CUDA-graph replay; x_best = faster of ort_rv, rv_cg / best of eager, ort,"
        " ort_opt; x_pad = the same / pad)",
        head,
    ]
    for model, size, batch in sorted({(r["model"], r["img_size"], r["batch"]) for r in records}):
        row = f"{model:<11}{size:>4}{batch:>5} " + "".join(
            " " + _fmt(ok.get((model, size, "none", v, batch))) for v in BASELINES
        )
        for pol in policies:
            row += "    " + "".join(" " + _fmt(ok.get((model, size, pol, v, batch))) for v in PRUNED)
            r = rat.get((model, size, batch, pol), {})
            xb, xp = r.get("speedup_vs_best_unpruned"), r.get("speedup_vs_padded")
            row += f"{xb:>7.2f}" if xb is not None else f"{'-':>7}"
            row += f"{xp:>6.2f}" if xp is not None else f"{'-':>6}"
        lines.append(row)
    top_b = max((r["batch"] for r in records), default=0)
    for i, pol in enumerate(policies):
        tokens = sorted(
            {
                (r["model"], r["img_size"], tuple(r["mean_tokens"]))
                for r in records
                if r["policy"] == pol
                and r["variant"] == "torch_raggedvit"
                and r.get("mean_tokens")
                and r["batch"] == top_b
            }
        )
        shown = "; ".join(f"{m} {s}: {list(t)}" for m, s, t in tokens)
        lines.append(f"P{i} = {pol}  mean tokens/image after each stage (B={top_b}): {shown or '-'}")
    bad = [r for r in records if r.get("status") != "ok"]
    if bad:
        counts: dict[str, int] = defaultdict(int)
        for r in bad:
            counts[r["status"]] += 1
        first = next((r for r in bad if r["status"] == "error"), bad[0])
        lines.append(
            f"not ok: {dict(counts)}; first: {first['model']} {first['img_size']} {first['variant']} "
            f"B={first['batch']}: {(first.get('error') or first.get('note') or '')[:150]}"
        )
    return "\n".join(lines)


def profile_lines(profiles: list[dict[str, Any]], top: int = 5) -> list[str]:
    """One line per profile: ORT model_run time, the top op types by node time, the top GPU kernel categories."""
    lines = []
    for p in profiles:
        head = f"profile {p.get('case')} {p.get('variant', '')} B={p.get('batch')}:"
        if "error" in p:
            lines.append(f"{head} {p['error'][:150]}")
            continue
        ort = p.get("ort", {})
        ops = ", ".join(f"{o['op_type']} {100 * (o['share'] or 0):.0f}%" for o in ort.get("ops", [])[:top])
        line = f"{head} model_run {ort.get('model_run_ms')} ms; ORT nodes: {ops}"
        gpu = p.get("gpu_kernels")
        if gpu:
            cats = ", ".join(f"{k} {v:.0f}us" for k, v in list(gpu["categories_us_per_run"].items())[:top])
            line += f"; GPU {gpu['gpu_ms_per_run']} ms: {cats}"
        lines.append(line)
    return lines


def plot(records: list[dict[str, Any]], path: Path, title: str) -> None:
    """img/s vs batch per variant (and policy), one panel per model x size (matplotlib Agg); one color per variant,
    one line style per policy (solid: unpruned)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["model"], r["img_size"]) for r in records})
    if not panels:
        return
    cols = min(2, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4.2 * rows), squeeze=False)
    policies = list(dict.fromkeys(r["policy"] for r in records if r["policy"] != "none"))
    styles = ["-", "--", ":", "-."]
    for ax, (model, size) in zip(axes.flat, panels):
        sel = [r for r in records if (r["model"], r["img_size"]) == (model, size) and r.get("status") == "ok"]
        for key in dict.fromkeys((r["variant"], r["policy"]) for r in sel):
            pts = sorted((r["batch"], r["img_per_s"]) for r in sel if (r["variant"], r["policy"]) == key)
            variant, pol = key
            ls = "-" if pol == "none" else styles[(policies.index(pol) + 1) % len(styles)]
            label = variant if pol == "none" else f"{variant} [{pol}]"
            color = f"C{(BASELINES + PRUNED).index(variant)}" if variant in BASELINES + PRUNED else None
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", linestyle=ls, color=color, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{model} {size}px")
        ax.set_xlabel("batch")
        ax.set_ylabel("images / s")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
