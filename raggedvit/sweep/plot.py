"""sweep.png: the quality of every point (agreement or top-1) against its img/s, the Pareto front drawn."""

from __future__ import annotations

from raggedvit.sweep.report import SweepResult

__all__ = ["plot_png"]

_OFFSETS = ((6, 6), (6, -12), (-6, 6), (-6, -12))  # label offsets in points, cycled so neighbours differ


def plot_png(result: SweepResult) -> bytes:
    """PNG bytes: one marker per point (a colour per policy), every point labelled with its grid values, the Pareto
    front as a line through its points. Needs matplotlib (no pyplot: the Agg canvas, no global state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not result.points:
        raise ValueError("no points to plot")
    s = result.settings
    metric = result.metric
    fig = Figure(figsize=(8, 5.5), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    policies = list(dict.fromkeys(p.policy for p in result.points))
    colors = {pol: f"C{i}" for i, pol in enumerate(policies)}
    for pol in policies:
        pts = [p for p in result.points if p.policy == pol]
        marker = "s" if pol == "none" else "o"
        ax.scatter(
            [p.img_per_s for p in pts],
            [100 * result.quality(p) for p in pts],
            c=colors[pol],
            marker=marker,
            s=36,
            label=pol,
            zorder=3,
        )
    front = sorted((p for p in result.points if p.key in result.pareto()), key=lambda p: p.img_per_s)
    if front:
        ax.plot(
            [p.img_per_s for p in front],
            [100 * result.quality(p) for p in front],
            color="0.4",
            linestyle="--",
            linewidth=1,
            zorder=2,
            label="Pareto front",
        )
    for i, p in enumerate(sorted(result.points, key=lambda p: (p.img_per_s, result.quality(p)))):
        text = p.label if p.policy == "none" else p.label.split(" ", 1)[1] if " " in p.label else p.label
        dx, dy = _OFFSETS[i % len(_OFFSETS)]
        ax.annotate(
            text,
            (p.img_per_s, 100 * result.quality(p)),
            textcoords="offset points",
            xytext=(dx, dy),
            ha="left" if dx > 0 else "right",
            fontsize=6.5,
            color=colors[p.policy],
        )
    ax.set_xlabel(f"images / s at batch {s.get('batch')} (ONNX Runtime, {s.get('dtype')})")
    ax.set_ylabel("top-1 accuracy (%)" if metric == "top1" else "top-1 agreement with the unpruned model (%)")
    ax.set_title(
        f"{s.get('model')}, {s.get('weights', {}).get('source', '?')} weights: "
        f"{s.get('device_name')} ({s.get('device')})",
        fontsize=9,
    )
    ax.grid(True, alpha=0.3)
    ax.margins(x=0.15, y=0.1)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
