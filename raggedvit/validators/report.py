"""Validation report: per-image rows, typed failures, near-ties; JSON and Markdown writers (atomic)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from raggedvit.outputs import atomic_write_all
from raggedvit.policies import get_policy
from raggedvit.validators.rules import Thresholds

if TYPE_CHECKING:  # structure.py reads torch modules; the report needs none
    from raggedvit.validators.structure import StructureReport

__all__ = ["blocks_before", "Failure", "ImageRow", "NearTie", "Thresholds", "TokenSwap", "ValidationReport"]

FailureKind = Literal[
    "block_drift", "kept_tokens", "max_abs_logit", "top1", "token_counts", "non_finite", "none_judged", "structure"
]


@dataclass(frozen=True)
class NearTie:
    """Image `image` is within `gap` of a different cut at stage `stage` (block `block`).

    kind "score": (last kept - first dropped score) / |last kept|;
    kind "mass": |cls-mass exclusive cumsum - mass| / mass;
    kind "swap" (precision ties only): the score or mass gap at a cut where the export swapped one kept token."""

    image: int
    stage: int
    block: int
    kind: Literal["score", "mass", "swap"]
    gap: float


@dataclass(frozen=True)
class Failure:
    """One failed criterion; image is None for whole-run criteria (top-1 agreement rate)."""

    kind: FailureKind
    image: int | None
    message: str

    def line(self) -> str:
        """ "kind: message", the kind once where the message already begins with it ("structure: block 3: ...")."""
        return self.message if self.message.startswith(f"{self.kind}:") else f"{self.kind}: {self.message}"


@dataclass(frozen=True)
class TokenSwap:
    """At `stage` (block `block`) the export kept the same number of tokens as the reference but `swapped` of
    them differ; `gap`: the reference's relative score gap between the swapped tokens (ties.token_swaps).
    `resized` (tome, ties.size_swaps): the same tokens, but that many of them hold other sizes (tokens merged into
    other rows; swapped 0)."""

    image: int
    stage: int
    block: int
    swapped: int
    gap: float
    resized: int = 0


@dataclass(frozen=True)
class ImageRow:
    """ORT vs reference on one image."""

    index: int
    name: str
    max_abs_diff: float
    mean_abs_diff: float
    top1_onnx: int
    top1_reference: int
    counts_onnx: list[int]
    counts_reference: list[int]
    near_tie: bool
    ref_max_abs_logit: float = 0.0  # scale of the reference logits (to read the absolute threshold against)
    floor_weights: float | None = None  # max |Δlogit| of the reference with weights rounded to the export dtype
    floor_torch: float | None = None  # max |Δlogit| of PyTorch's own forward in the export dtype
    floor_weights_same_counts: bool | None = None  # that floor run kept the reference's token counts
    floor_torch_same_counts: bool | None = None
    precision_tie: bool = False  # the export moved a cut within its precision's margin (not judged)
    token_swaps: list[TokenSwap] = field(default_factory=list)  # stages where equal counts kept other tokens
    block_drift: list[float | None] = field(default_factory=list)  # per block ||Δh|| / ||h|| on the kept rows

    @property
    def top1_agree(self) -> bool:
        return self.top1_onnx == self.top1_reference

    @property
    def counts_agree(self) -> bool:
        return self.counts_onnx == self.counts_reference


@dataclass
class ValidationReport:
    """Summary of one validation run; `passed` iff there are no failures."""

    model: str
    recipe: dict[str, Any]
    device: str
    providers: list[str]
    thresholds: Thresholds
    rows: list[ImageRow] = field(default_factory=list)
    near_ties: list[NearTie] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    precision_ties: list[NearTie] = field(default_factory=list)  # the reference margin behind each moved cut
    block_floor: list[float | None] = field(default_factory=list)  # per block: the floor of the per-block rule
    block_note: str = ""  # why per-block drift was not measured (empty when it was)
    structure: StructureReport | None = None  # the graph's attributes against the reference's modules (None: off)

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def max_abs_diff(self) -> float:
        return max((r.max_abs_diff for r in self.rows), default=0.0)

    @property
    def mean_abs_diff(self) -> float:
        return sum(r.mean_abs_diff for r in self.rows) / max(len(self.rows), 1)

    @property
    def ref_max_abs_logit(self) -> float:
        return max((r.ref_max_abs_logit for r in self.rows), default=0.0)

    @property
    def judged(self) -> list[ImageRow]:
        """The rows the pass criteria read: neither a near-tie nor a precision tie."""
        return [r for r in self.rows if not (r.near_tie or r.precision_tie)]

    @property
    def has_floor(self) -> bool:
        return any(r.floor_weights is not None for r in self.rows)

    def floor_summary(self) -> dict[str, float | None] | None:
        """The precision floor next to this export, over the images that are not near-ties. Each max leaves out
        the images where that run (the export, or a floor run) kept other token counts than the reference: a moved
        cut is a different selection, not arithmetic. within_torch_fp16 compares the export with PyTorch's own
        fp16 forward on the images where both kept the reference's counts. None without a floor."""
        judged = [r for r in self.rows if not r.near_tie and r.floor_weights is not None]
        if not judged:
            return None
        weights = [float(r.floor_weights or 0.0) for r in judged if r.floor_weights_same_counts is not False]
        ours = [float(r.floor_torch or 0.0) for r in judged if r.floor_torch_same_counts is not False]
        export = [r.max_abs_diff for r in judged if r.counts_agree]
        both = [r for r in judged if r.counts_agree and r.floor_torch_same_counts is not False]
        within = None
        if both:
            within = bool(max(r.max_abs_diff for r in both) <= max(float(r.floor_torch or 0.0) for r in both))
        return {
            "export_max_abs_diff": max(export, default=None),
            "weights_max_abs_diff": max(weights, default=None),
            "torch_max_abs_diff": max(ours, default=None),
            "images": len(judged),
            "export_other_counts": len(judged) - len(export),
            "weights_other_counts": len(judged) - len(weights),
            "torch_other_counts": len(judged) - len(ours),
            # True: no farther from fp32 than PyTorch's own fp16 forward (None: no image to compare on)
            "within_torch_fp16": within,
        }

    @property
    def top1_agreement(self) -> float:
        return sum(r.top1_agree for r in self.rows) / max(len(self.rows), 1)

    @property
    def counts_agreement(self) -> float:
        return sum(r.counts_agree for r in self.rows) / max(len(self.rows), 1)

    def block_table(self) -> list[dict[str, Any]]:
        """Per block over the images the block rule reads (all but near-ties; a precision tie's blocks before its
        first deviation): the largest drift, the floor, the largest drift / floor ratio, the rule's bar and how
        many images exceed it."""
        th = self.thresholds
        out = []
        rows = [r for r in self.rows if not r.near_tie]
        for bi, f in enumerate(self.block_floor):
            ds = [r.block_drift[bi] for r in rows if len(r.block_drift) > bi and r.block_drift[bi] is not None]
            d = max(ds, default=None)
            ratio = None if d is None or not f else d / f
            bar = None if f is None else th.block_bar(f)
            failed = 0 if bar is None else sum(v > bar for v in ds)
            out.append({"block": bi, "drift": d, "floor": f, "ratio": ratio, "bar": bar, "images_over": failed})
        return out

    def block_summary(self) -> str:
        """One line: the first block that fails on any judged image, and how far within their floors the blocks
        before it are; or how far within the floors every block is."""
        if not self.block_floor:
            return self.block_note
        table = self.block_table()
        bad = [t for t in table if t["images_over"]]
        ratios = [t["ratio"] for t in table if t["ratio"] is not None]
        name = self.thresholds.floor_name()
        if not bad:
            return f"every block within {max(ratios, default=0.0):.2g}x its {name} floor"
        first = bad[0]
        before = [t["ratio"] for t in table[: first["block"]] if t["ratio"] is not None]
        rest = blocks_before(first["block"], max(before, default=0.0))
        n = sum(not r.near_tie for r in self.rows)
        return (
            f"block {first['block']} drifts {first['ratio']:.3g}x its {name} floor ({first['images_over']} of {n} "
            f"images over the bar); {rest}"
        )

    def to_dict(self) -> dict[str, Any]:
        rows = [{**asdict(r), "top1_agree": r.top1_agree, "counts_agree": r.counts_agree} for r in self.rows]
        return {
            "passed": self.passed,
            "model": self.model,
            "device": self.device,
            "providers": self.providers,
            "thresholds": self.thresholds.to_dict(),
            "summary": {
                "images": len(self.rows),
                "max_abs_diff": self.max_abs_diff,
                "mean_abs_diff": self.mean_abs_diff,
                "top1_agreement": self.top1_agreement,
                "token_counts_agreement": self.counts_agreement,
                "near_ties": len(self.near_ties),
                "precision_ties": len(self.precision_ties),
                "judged_images": len(self.judged),
                "reference_max_abs_logit": self.ref_max_abs_logit,
                "precision_floor": self.floor_summary(),
                "blocks": self.block_summary(),
                "structure": None if self.structure is None else self.structure.summary(),
            },
            "block_rule": {
                "text": self.thresholds.block_text(),
                "k": self.thresholds.block_k,
                "atol": self.thresholds.block_atol,
                "floor": self.thresholds.floor_name(),
            },
            "blocks": self.block_table(),
            "structure": None if self.structure is None else self.structure.to_dict(),
            "failures": [asdict(f) for f in self.failures],
            "near_ties": [asdict(t) for t in self.near_ties],
            "precision_ties": [asdict(t) for t in self.precision_ties],
            "token_swaps": [asdict(t) for r in self.rows for t in r.token_swaps],
            "rows": rows,
            "recipe": self.recipe,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n"

    def to_markdown(self) -> str:
        r, th = self.recipe, self.thresholds
        prune = r.get("prune", {})
        lines = [
            f"## raggedvit validation: {'PASS' if self.passed else 'FAIL'}",
            "",
            f"- model: `{self.model}` ({r.get('model', '?')}, {r.get('dtype', '?')}, img {r.get('img_size', '?')})",
            f"- pruning: {_prune_text(prune)}",
            f"- ONNX Runtime: {self.device} ({', '.join(self.providers)}); reference: PyTorch fp32 PrunedViT on CPU",
            f"- rule: {th.text()}; top-1 >= {th.min_top1:.0%}; {th.tie_text()}",
            f"- reference logits: max |logit| {self.ref_max_abs_logit:.3g} (the absolute Δlogit threshold is "
            f"{th.max_abs_logit / max(self.ref_max_abs_logit, 1e-30):.2%} of it)",
        ]
        if self.block_floor:
            lines.append(f"- {th.block_text()}: {self.block_summary()}")
        elif self.block_note:
            lines.append(f"- {self.block_note}")
        if self.structure is not None:
            lines.append(
                f"- structure (the graph's attributes against the reference's modules): {self.structure.summary()}"
            )
            lines += [f"  - not compared: {note}" for note in self.structure.notes]
        lines += _floor_lines(self.floor_summary(), r.get("dtype", "?"))
        lines += [
            "",
            "| images | judged | max abs Δlogit | mean abs Δlogit | top-1 agreement | token_counts agreement "
            "| near-ties | precision ties |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|",
            f"| {len(self.rows)} | {len(self.judged)} | {self.max_abs_diff:.3e} | {self.mean_abs_diff:.3e} "
            f"| {self.top1_agreement:.1%} | {self.counts_agreement:.1%} | {len(self.near_ties)} "
            f"| {len(self.precision_ties)} |",
            "",
            "| # | image | max abs Δ | mean abs Δ | top-1 onnx / ref | tokens onnx | tokens ref | near-tie |"
            + (" floor: weights | floor: torch |" if self.has_floor else ""),
            "|---:|---|---:|---:|---|---|---|---|" + ("---:|---:|" if self.has_floor else ""),
        ]
        for row in self.rows:
            mark = "" if row.top1_agree else " ✗"
            cmark = "" if row.counts_agree else " ✗"
            floor = (
                f" {_num(row.floor_weights, row.floor_weights_same_counts)} "
                f"| {_num(row.floor_torch, row.floor_torch_same_counts)} |"
                if self.has_floor
                else ""
            )
            lines.append(
                f"| {row.index} | {row.name} | {row.max_abs_diff:.3e} | {row.mean_abs_diff:.3e} "
                f"| {row.top1_onnx} / {row.top1_reference}{mark} | {_counts(row.counts_onnx)}{cmark} "
                f"| {_counts(row.counts_reference)} | {_tie_mark(row)} |{floor}"
            )
        if self.block_floor:
            name = th.floor_name()
            lines += [
                "",
                f"| block | max drift | {name} floor | ratio | bar | images over |",
                "|---:|---:|---:|---:|---:|---:|",
            ]
            lines += [
                f"| {t['block']} | {_num(t['drift'])} | {_num(t['floor'])} | "
                f"{'-' if t['ratio'] is None else format(t['ratio'], '.3g')} | {_num(t['bar'])} | {t['images_over']} |"
                for t in self.block_table()
            ]
        if self.near_ties:
            lines += ["", "Near-ties at a pruning cut (listed, not failed):", ""]
            lines += [
                f"- image {t.image}, stage {t.stage} (block {t.block}): {t.kind} gap {t.gap:.2e}"
                for t in self.near_ties
            ]
        if self.precision_ties:
            eps = self.thresholds.precision_eps or 0.0
            head = (f"Precision ties: the export moved a cut (or swapped one kept token at it) whose reference margin "
                    f"is < {eps:.3g} (logits not compared)")  # fmt: skip
            lines += ["", head + ", not failed:", ""]
            names = {row.index: row for row in self.rows}
            lines += [
                f"- image {t.image} ({names[t.image].name}), stage {t.stage} (block {t.block}): token counts "
                f"{_counts(names[t.image].counts_onnx)} vs reference {_counts(names[t.image].counts_reference)}; "
                f"{t.kind} gap {t.gap:.2e}"
                for t in self.precision_ties
            ]
        swaps = [(row, t) for row in self.rows for t in row.token_swaps]
        if swaps:
            lines += ["", "Kept tokens that differ at a cut with equal counts:", ""]
            lines += [
                f"- image {t.image} ({row.name}), stage {t.stage} (block {t.block}): {t.swapped} token"
                f"{'' if t.swapped == 1 else 's'} swapped"
                + (f", {t.resized} merged row{'' if t.resized == 1 else 's'} of another size" if t.resized else "")
                + f"; reference score gap between them {t.gap:.2e}"
                for row, t in swaps
            ]
        if self.failures:
            lines += ["", "Failures:", ""]
            lines += [f"- {f.line()}" for f in self.failures]
        return "\n".join(lines) + "\n"

    def write(self, base: str | Path) -> tuple[Path, Path]:
        """Write BASE.json and BASE.md (a .json/.md suffix on `base` is replaced) atomically; returns both paths."""
        base = Path(base)
        if base.suffix in (".json", ".md"):
            base = base.with_suffix("")
        js, md = base.with_name(base.name + ".json"), base.with_name(base.name + ".md")
        atomic_write_all({js: self.to_json(), md: self.to_markdown()})  # both files or neither
        return js, md


def blocks_before(block: int, within: float) -> str:
    """'blocks 0-6 within 1.2x' (the blocks before a failing `block` and their largest drift / floor ratio)."""
    if block == 0:
        return "it is the first block"
    return f"{'block 0' if block == 1 else f'blocks 0-{block - 1}'} within {within:.2g}x"


def _num(v: float | None, same_counts: bool | None = None) -> str:
    return "-" if v is None else f"{v:.3e}" + (" ≠" if same_counts is False else "")


def _floor_lines(floor: dict[str, float | None] | None, dtype: str) -> list[str]:
    if floor is None:
        return []
    line = (
        f"- precision floor of {dtype} (PyTorch on CPU, near-ties excluded): rounding the weights alone moves the "
        f"fp32 reference by up to {_num(floor['weights_max_abs_diff'])}; PyTorch's own fp16 forward (model.half()) "
        f"by up to {_num(floor['torch_max_abs_diff'])}; this export by up to {_num(floor['export_max_abs_diff'])}"
    )
    other = [
        f"{n} of the {what}"
        for n, what in (
            (floor["export_other_counts"], "export's images"),
            (floor["weights_other_counts"], "rounded-weights runs"),
            (floor["torch_other_counts"], "fp16 runs"),
        )
        if n
    ]
    if other:
        line += f" (left out: {' and '.join(other)} kept other token counts than the reference; ✗ / ≠ in the table)"
    lines = [line]
    if floor["within_torch_fp16"] is True:
        lines.append(
            "- reading: this export is no farther from the fp32 reference than PyTorch's own fp16 forward; a "
            "|Δlogit| failure here is fp16 rounding, not an export fault"
        )
    elif floor["within_torch_fp16"] is False:
        lines.append(
            "- reading: this export is farther from the fp32 reference than PyTorch's own fp16 forward on these "
            "images: check the worst one for an export or kernel fault before loosening the threshold (two tokens "
            "swapping places at a cut, same counts, also does this)"
        )
    return lines


def _tie_mark(row: ImageRow) -> str:
    return "yes" if row.near_tie else ("precision" if row.precision_tie else "")


def _counts(c: list[int]) -> str:
    return "-" if not c else ",".join(str(v) for v in c)


def _prune_text(prune: dict[str, Any]) -> str:
    """The recipe's pruning spec as the policy's label (raggedvit.policies: the sweep prints the same)."""
    return get_policy(str(prune.get("policy", "none"))).label(prune)
