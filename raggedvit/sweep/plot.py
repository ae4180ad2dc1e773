"""sweep.png: the quality of every point (agreement or top-1) against its img/s, the Pareto front drawn."""

from __future__ import annotations

from raggedvit.policies import get_policy
from raggedvit.sweep.report import SweepResult

__all__ = ["plot_png"]

# candidate label positions around a point, in points: nearest first; the far ones get a leader line
_RADII = (7, 16, 28, 42, 58)
_ANGLES = (30, -30, 150, -150, 90, -90, 0, 180)


def plot_png(result: SweepResult) -> bytes:
    """PNG bytes: one marker per measured point (a colour per policy; a point equal to a measured one shares its
    marker), every one labelled with its grid values, the Pareto front as a line through its points. Needs matplotlib
    (no pyplot: the Agg canvas, no global state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not result.points:
        raise ValueError("no points to plot")
    s = result.settings
    metric = result.metric
    fig = Figure(figsize=(8, 5.5), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    groups: dict[str, list] = {}  # the points of each policy, in first-seen order
    for p in result.measured():
        groups.setdefault(p.policy, []).append(p)
    colors = {pol: f"C{i}" for i, pol in enumerate(groups)}
    for pol, pts in groups.items():
        marker = "o" if get_policy(pol).prunes else "s"
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
    _label_points(fig, ax, result, colors)
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _label_points(fig, ax, result: SweepResult, colors: dict[str, str]) -> None:
    """Every point's label at the first candidate position whose text overlaps no marker, no label placed before it
    and not the legend, inside the axes (else at the candidate that overlaps least)."""
    import math

    renderer = fig.canvas.get_renderer()
    pts = sorted(result.measured(), key=lambda p: (-result.quality(p), p.img_per_s))
    xy = {p.key: (p.img_per_s, 100 * result.quality(p)) for p in pts}
    markers = {k: ax.transData.transform(v) for k, v in xy.items()}
    legend = ax.get_legend()
    taken = [legend.get_window_extent(renderer)] if legend is not None else []
    frame = ax.get_window_extent(renderer)

    def cost(box, key: str) -> float:
        area = sum(_overlap(box, t) for t in taken)
        for k, (mx, my) in markers.items():
            if k != key:
                area += _overlap(box, _Box(mx - 4, my - 4, mx + 4, my + 4))
        outside = (box.x1 - box.x0) * (box.y1 - box.y0) - _overlap(box, frame)
        return area + 10 * outside

    scale = fig.dpi / 72.0  # points -> display pixels
    for p in pts:
        text = p.label if not get_policy(p.policy).prunes or " " not in p.label else p.label.split(" ", 1)[1]
        probe = ax.annotate(text, xy[p.key], fontsize=6.5)
        size = probe.get_window_extent(renderer)
        w, h = size.width, size.height
        probe.remove()
        mx, my = markers[p.key]
        best: tuple[float, float, float, _Box] | None = None
        for dx, dy in _candidates():
            x = mx + dx * scale
            y = my + dy * scale
            x0 = x if dx > 0.5 else x - w if dx < -0.5 else x - w / 2
            y0 = y if dy > 0.5 else y - h if dy < -0.5 else y - h / 2
            box = _Box(x0, y0, x0 + w, y0 + h)
            c = cost(box, p.key)
            if best is None or c < best[0]:
                best = (c, dx, dy, box)
            if c == 0:
                break
        assert best is not None
        _, dx, dy, box = best
        ax.annotate(
            text, xy[p.key], textcoords="offset points", xytext=(dx, dy), fontsize=6.5, color=colors[p.policy],
            ha="left" if dx > 0.5 else "right" if dx < -0.5 else "center",
            va="bottom" if dy > 0.5 else "top" if dy < -0.5 else "center",
            arrowprops={"arrowstyle": "-", "color": "0.6", "lw": 0.5} if math.hypot(dx, dy) > _RADII[0] + 1 else None,
        )  # fmt: skip
        pad = 3.0  # display pixels between neighbouring labels
        taken.append(_Box(box.x0 - pad, box.y0 - pad, box.x1 + pad, box.y1 + pad))


def _candidates() -> list[tuple[float, float]]:
    """Label offsets in points, nearest first."""
    import math

    return [(r * math.cos(math.radians(a)), r * math.sin(math.radians(a))) for r in _RADII for a in _ANGLES]


class _Box:
    """A display-space rectangle (the few attributes _overlap reads of a matplotlib Bbox)."""

    def __init__(self, x0: float, y0: float, x1: float, y1: float) -> None:
        self.x0, self.y0, self.x1, self.y1 = x0, y0, x1, y1


def _overlap(a, b) -> float:
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return w * h if w > 0 and h > 0 else 0.0
