"""A sweep's results: one PointResult per point, the Pareto front, and the JSON, CSV and Markdown forms."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from raggedvit.policies import get_policy

__all__ = ["FILES", "PointResult", "SweepResult"]

FILES = ("sweep.json", "sweep.csv", "sweep.md", "sweep.png")


@dataclass(frozen=True)
class PointResult:
    """One point (DESIGN.md section 7 says what each number measures).

    key: identity of the point (its PruneSpec as canonical JSON); label: "topk-l2 keep=0.5 at=4"; params: its grid
    keys and values; spec: PruneSpec.to_dict(). Accuracy side (PyTorch): agreement, top1, top5 (None without
    labels), kl, tokens per stage, gflops per image, flops_ratio. Speed side (ONNX Runtime at the sweep's batch):
    img_per_s, latency_ms (median; p10_ms, p90_ms), gpu_ms (CUDA only), runs, cuda_graph. seconds: wall time the
    point took to measure. same_as: the key of the point whose numbers these are, for a point that runs the same model
    as it (raggedvit.sweep.grid.equal_points) and was not measured again (seconds 0); None for a measured point."""

    key: str
    label: str
    policy: str
    params: dict[str, Any]
    spec: dict[str, Any]
    agreement: float
    top1: float | None
    top5: float | None
    kl: float
    tokens: list[float]
    gflops: float
    flops_ratio: float
    img_per_s: float
    latency_ms: float
    p10_ms: float
    p90_ms: float
    gpu_ms: float | None
    runs: int
    cuda_graph: bool
    seconds: float
    same_as: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PointResult:
        """The fields of a sweep.json point (derived columns such as speedup and pareto are left out; a field with a
        default may be missing: a file written before it existed)."""
        values = {f.name: data[f.name] if f.default is MISSING else data.get(f.name, f.default) for f in fields(cls)}
        return cls(**values)


@dataclass
class SweepResult:
    """settings: what was swept and how (model, weights, device, batch, dtype, images, versions); points: the unpruned
    baseline (policy none) first, then the grid's points in its order, then the finished points of an earlier run
    (same settings) that the grid no longer lists."""

    settings: dict[str, Any]
    points: list[PointResult] = field(default_factory=list)

    @property
    def metric(self) -> str:
        """The quality axis: "top1" with labelled images, else "agreement" (with the unpruned model)."""
        return "top1" if self.settings.get("images", {}).get("labelled") else "agreement"

    def quality(self, point: PointResult) -> float:
        return float(getattr(point, self.metric))

    @property
    def baseline(self) -> PointResult | None:
        return next((p for p in self.points if not get_policy(p.policy).prunes), None)

    def row_label(self, point: PointResult) -> str:
        """The point's label in the table: "tome r=120 (= tome r=98)" for a point equal to a measured one."""
        if point.same_as is None:
            return point.label
        twin = next((p.label for p in self.points if p.key == point.same_as), "?")
        return f"{point.label} (= {twin})"

    def measured(self) -> list[PointResult]:
        """The points that were measured (not equal to another point: same_as None), in order."""
        return [p for p in self.points if p.same_as is None]

    def speedup(self, point: PointResult) -> float | None:
        """img/s over the unpruned baseline's."""
        base = self.baseline
        return point.img_per_s / base.img_per_s if base is not None and base.img_per_s > 0 else None

    def pareto(self) -> set[str]:
        """Keys of the measured points no other point beats: none is at least as fast and as good with one of the two
        strictly better (img/s against `metric`). A point equal to a measured one is not a point of its own."""
        pts = [(p.img_per_s, self.quality(p), p.key) for p in self.measured()]
        return {k for s, q, k in pts if not any(s2 >= s and q2 >= q and (s2 > s or q2 > q) for s2, q2, _ in pts)}

    def by_speed(self) -> list[PointResult]:
        """The points, fastest first."""
        return sorted(self.points, key=lambda p: -p.img_per_s)

    def to_dict(self) -> dict[str, Any]:
        front = self.pareto()
        rows = []
        for p in self.points:
            speed = self.speedup(p)
            rows.append({**asdict(p), "speedup": speed, "pareto": p.key in front})
        return {"settings": self.settings, "metric": self.metric, "points": rows}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SweepResult:
        return cls(dict(data["settings"]), [PointResult.from_dict(p) for p in data.get("points", [])])

    @classmethod
    def load(cls, path: str | Path) -> SweepResult:
        """A sweep.json."""
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))

    def param_keys(self) -> list[str]:
        """Every grid key of the points, in order of first appearance (the CSV's parameter columns)."""
        keys: list[str] = []
        for p in self.points:
            keys += [k for k in p.params if k not in keys]
        return keys

    def to_csv(self) -> str:
        """One row per point, fastest first; a column per grid key (empty where a policy has no such key); same_as:
        the label of the measured point a point equals."""
        front = self.pareto()
        keys = self.param_keys()
        head = ["label", "policy", *keys, "img_per_s", "speedup", "latency_ms", "p10_ms", "p90_ms", "gpu_ms"]
        head += ["cuda_graph", "agreement", "top1", "top5", "kl", "tokens", "gflops", "flops_ratio", "pareto"]
        head.append("same_as")
        labels = {p.key: p.label for p in self.points}
        buf = io.StringIO()
        out = csv.writer(buf, lineterminator="\n")
        out.writerow(head)
        for p in self.by_speed():
            params = [_cell(p.params.get(k, "")) for k in keys]
            out.writerow(
                [p.label, p.policy, *params, f"{p.img_per_s:.6g}", _cell(self.speedup(p)), f"{p.latency_ms:.6g}"]
                + [f"{p.p10_ms:.6g}", f"{p.p90_ms:.6g}", _cell(p.gpu_ms), int(p.cuda_graph), f"{p.agreement:.6g}"]
                + [_cell(p.top1), _cell(p.top5), f"{_kl(p.kl):.6g}", " ".join(f"{t:.6g}" for t in p.tokens)]
                + [f"{p.gflops:.6g}", f"{p.flops_ratio:.6g}", int(p.key in front), labels.get(p.same_as or "", "")]
            )
        return buf.getvalue()

    def to_markdown(self) -> str:
        """A title line, what was run, and the table fastest first, Pareto points marked ●."""
        s = self.settings
        images = s.get("images", {})
        lines = [
            f"# Sweep: {s.get('model')}",
            "",
            f"{s.get('weights', {}).get('source', '?')} weights, {s.get('dtype')} export, batch {s.get('batch')}, "
            f"{s.get('device_name')} ({s.get('device')}); {images.get('count')} images ({images.get('source')}). "
            f"● = Pareto point: no other point is both faster and better by {self._metric_name()}. "
            "Agreement on seeded weights says nothing about accuracy on trained ones.",
            "",
        ]
        return "\n".join(lines + self.table()) + "\n"

    def table(self, *, pareto_only: bool = False) -> list[str]:
        """The Markdown table's lines, fastest first, Pareto points marked ● (only those with pareto_only)."""
        front = self.pareto()
        labelled = self.metric == "top1"
        gpu = any(p.gpu_ms is not None for p in self.points)
        cols = ["", "point", "img/s", "speedup", *(["GPU ms"] if gpu else []), "agreement"]
        cols += ["top-1", "top-5"] if labelled else []
        cols += ["KL", "tokens per stage", "FLOPs"]
        align = ["---" if c in ("", "point") else "---:" for c in cols]
        lines = ["| " + " | ".join(cols) + " |", "|" + "|".join(align) + "|"]
        for p in self.by_speed():
            if pareto_only and p.key not in front:
                continue
            speed = self.speedup(p)
            row = ["●" if p.key in front else "", self.row_label(p), f"{p.img_per_s:,.1f}"]
            row.append(f"{speed:.2f}x" if speed else "-")
            row += [f"{p.gpu_ms:.3f}" if p.gpu_ms is not None else "-"] if gpu else []
            row.append(f"{100 * p.agreement:.1f}%")
            row += [f"{100 * (p.top1 or 0):.1f}%", f"{100 * (p.top5 or 0):.1f}%"] if labelled else []
            tokens = ", ".join(f"{t:.1f}" for t in p.tokens) or "-"
            if len(p.tokens) > 4:  # a stage per block (tome): the first and the last
                tokens = f"{p.tokens[0]:.1f} … {p.tokens[-1]:.1f} ({len(p.tokens)} stages)"
            row += [f"{_kl(p.kl):.4f}", tokens, f"{p.flops_ratio:.2f}x"]
            lines.append("| " + " | ".join(row) + " |")
        return lines

    def _metric_name(self) -> str:
        return "top-1 accuracy" if self.metric == "top1" else "agreement with the unpruned model"


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def _kl(kl: float) -> float:
    """KL as printed: a divergence is >= 0, so float rounding's tiny negatives (and -0.0) print as 0."""
    return max(kl, 0.0) + 0.0
