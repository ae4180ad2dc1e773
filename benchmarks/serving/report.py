"""Results of benchmarks.serving: ratios to torch.compile unpruned, the speed bars, the floor, table and PNG.

Reads records only (no torch): `python3 -m benchmarks.serving` writes them, these functions derive the rest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.serving.names import BARS, BASELINE, VARIANTS

__all__ = ["apply_floor", "plot", "ratios", "table", "targets"]


def _ok(records: list[dict[str, Any]]) -> dict[tuple, dict[str, Any]]:
    """(model, variant, policy, batch) -> record, successful records only."""
    return {(r["model"], r["variant"], r["policy"], r["batch"]): r for r in records if r.get("status") == "ok"}


def ratios(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """img/s of every variant over BASELINE (torch.compile unpruned) on the same model and batch; None where
    either side has no measurement. Also sets rec["vs_compile_unpruned"] on each record."""
    ok = _ok(records)
    out = []
    for r in records:
        base = ok.get((r["model"], BASELINE, "none", r["batch"]))
        v = r["img_per_s"] / base["img_per_s"] if r.get("status") == "ok" and base else None
        r["vs_compile_unpruned"] = round(v, 3) if v is not None else None
        if r["variant"] != BASELINE:
            out.append(
                {
                    "model": r["model"],
                    "variant": r["variant"],
                    "policy": r["policy"],
                    "batch": r["batch"],
                    "mode": r.get("mode"),
                    "img_per_s": r.get("img_per_s"),
                    "baseline_img_per_s": base["img_per_s"] if base else None,
                    "ratio": r["vs_compile_unpruned"],
                }
            )
    return out


def _gpu_time_ratio(rec: dict[str, Any] | None, base: dict[str, Any] | None) -> float | None:
    """BASELINE's GPU time per image over the variant's (both profiled): the bar's ratio without host time (at batch
    1 torch.compile's wall time is mostly host time)."""
    g, gb = (rec or {}).get("gpu_us_per_image"), (base or {}).get("gpu_us_per_image")
    return round(gb / g, 3) if g and gb else None


def _round_ratios(rec: dict[str, Any] | None, base: dict[str, Any] | None) -> list[float] | None:
    """BASELINE's ms per batch over the variant's in each round (the rounds interleave the variants, so a round pairs
    two runs taken seconds apart): how far the bar's ratio moves with the baseline's host-bound rounds (torch.compile's
    rounds at B=4 can differ by ~25% within one run). None unless both have every round."""
    r, rb = (rec or {}).get("round_ms") or [], (base or {}).get("round_ms") or []
    if not r or len(r) != len(rb) or not all(x > 0 for x in r):
        return None
    return [round(b / x, 3) for b, x in zip(rb, r)]


def targets(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each bar of names.BARS per model and batch of the run: measured ratio (img/s, what the bar judges), mode, met
    (False when unmeasured), and for reference the GPU-time ratio (None without both profiles) and the ratio of
    each round (`round_ratios`; `met_every_round`: the bar holds in every round, None without them)."""
    ok = _ok(records)
    run_batches = {r["batch"] for r in records}
    rows = []
    for model in dict.fromkeys(r["model"] for r in records):
        for bar in BARS:
            policies = [p for p in dict.fromkeys(r["policy"] for r in records) if p.split(":")[0] == bar.policy]
            for policy in policies:
                for b in (b for b in bar.batches if b in run_batches):
                    rec = ok.get((model, bar.variant, policy, b))
                    base = ok.get((model, BASELINE, "none", b))
                    ratio = rec["img_per_s"] / base["img_per_s"] if rec and base else None
                    mode_ok = rec is not None and (bar.mode is None or rec.get("mode") == bar.mode)
                    why = None
                    if rec is None or base is None:
                        why = f"not measured ({'variant' if rec is None else BASELINE})"
                    elif not mode_ok:
                        why = f"ran as {rec.get('mode')}, the bar asks for {bar.mode}"
                    per_round = _round_ratios(rec, base) if rec and base else None
                    rows.append(
                        {
                            "bar": bar.text,
                            "model": model,
                            "policy": policy,
                            "variant": bar.variant,
                            "batch": b,
                            "min_ratio": bar.min_ratio,
                            "ratio": round(ratio, 3) if ratio is not None else None,
                            "gpu_time_ratio": _gpu_time_ratio(rec, base),
                            "round_ratios": per_round,
                            "met_every_round": (
                                None if per_round is None else bool(mode_ok and min(per_round) >= bar.min_ratio)
                            ),
                            "mode": rec.get("mode") if rec else None,
                            "met": bool(ratio is not None and mode_ok and ratio >= bar.min_ratio),
                            "why_not": why,
                        }
                    )
    return rows


def apply_floor(records: list[dict[str, Any]], weight_bytes: dict[str, int], bandwidth: dict[str, Any]) -> None:
    """Batch-1 records get the weight-bandwidth floor (fp16 weight bytes / HBM bytes per second) and their
    latency over it, for the table bandwidth and the measured copy bandwidth (each when known)."""
    for r in records:
        if r["batch"] != 1 or r.get("status") != "ok" or r["model"] not in weight_bytes:
            continue
        floor: dict[str, Any] = {"weight_bytes_fp16": weight_bytes[r["model"]]}
        for name in ("table", "measured"):
            bw = bandwidth.get(f"{name}_bytes_per_s")
            if bw:
                floor_ms = weight_bytes[r["model"]] / bw * 1e3
                floor[f"{name}_floor_ms"] = round(floor_ms, 5)
                floor[f"latency_over_{name}_floor"] = round(r["ms_per_batch"] / floor_ms, 2)
        r["floor"] = floor


def _fmt(v: float | None, width: int = 9) -> str:
    if v is None:
        return f"{'-':>{width}}"
    return f"{v:>{width},.0f}" if v >= 100 else f"{v:>{width}.2f}"


def table(records: list[dict[str, Any]], rows: list[dict[str, Any]]) -> str:
    """img/s per (model, variant, policy) and batch with the ratio to BASELINE, then the bars."""
    ok = _ok(records)
    batches = sorted({r["batch"] for r in records})
    lines = [
        f"{'model':<11}{'variant':<19}{'policy':<35}{'mode':<23}" + "".join(f"{'B=' + str(b):>16}" for b in batches)
    ]
    keys = dict.fromkeys((r["model"], r["variant"], r["policy"]) for r in records)
    for model, variant, policy in sorted(keys, key=lambda k: (k[0], VARIANTS.index(k[1]) if k[1] in VARIANTS else 99)):
        recs = [ok.get((model, variant, policy, b)) for b in batches]
        mode = next((r["mode"] for r in recs if r), "-")
        cells = []
        for r in recs:
            x = r.get("vs_compile_unpruned") if r else None
            cells.append(_fmt(r["img_per_s"] if r else None) + (f" {x:5.2f}x" if x is not None else "       "))
        lines.append(f"{model:<11}{variant:<19}{policy[:34]:<35}{str(mode)[:22]:<23}" + "".join(cells))
    met = sum(r["met"] for r in rows)
    lines.append(f"bars: {met}/{len(rows)} met (ratio = img/s over {BASELINE} unpruned at the same batch)")
    for r in rows:
        shown = f"{r['ratio']:.2f}x" if r["ratio"] is not None else "-"
        if r.get("round_ratios"):
            shown += f" (rounds {min(r['round_ratios']):.2f}-{max(r['round_ratios']):.2f}x)"
        head = f"  {'MET ' if r['met'] else 'miss'} {r['model']} B={r['batch']} [{r['policy']}]: {shown}"
        lines.append(f"{head}  {r['bar']}" + (f" ({r['why_not']})" if r["why_not"] else ""))
    bad = [r for r in records if r.get("status") != "ok"]
    if bad:
        first = next((r for r in bad if r["status"] == "error"), bad[0])
        lines.append(
            f"not ok: {len(bad)} records; first: {first['model']} {first['variant']} [{first['policy']}] "
            f"B={first['batch']}: {(first.get('error') or '')[:200]}"
        )
    return "\n".join(lines)


def plot(records: list[dict[str, Any]], path: Path, title: str) -> None:
    """img/s vs batch, one panel per model, one line per (variant, policy) (matplotlib Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in records))
    if not models:
        return
    fig, axes = plt.subplots(1, len(models), figsize=(7 * len(models), 4.5), squeeze=False)
    policies = list(dict.fromkeys(r["policy"] for r in records))
    styles = ["-", "--", ":", "-."]
    for ax, model in zip(axes.flat, models):
        sel = [r for r in records if r["model"] == model and r.get("status") == "ok"]
        for variant, policy in dict.fromkeys((r["variant"], r["policy"]) for r in sel):
            pts = sorted((r["batch"], r["img_per_s"]) for r in sel if (r["variant"], r["policy"]) == (variant, policy))
            color = f"C{VARIANTS.index(variant)}" if variant in VARIANTS else None
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                marker="o",
                linestyle=styles[policies.index(policy) % len(styles)],
                color=color,
                label=variant if policy == "none" else f"{variant} [{policy}]",
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(model)
        ax.set_xlabel("batch")
        ax.set_ylabel("images / s")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
