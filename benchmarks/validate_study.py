"""False-failure study of `raggedvit validate`: clean exports must pass, every mutant must fail naming its fault.

    python3 -m benchmarks.validate_study --out benchmarks/results [--device cuda] [--images 64] [--jobs 8]

Clean exports of deit_tiny, deit_small and deit_base (seeded weights) under topk-l2, evit, cls-mass (capacity
layout) and tome (r 8 and 16 in every block), two prune schedules each (SCHEDULES), in fp16 and fp16-all,
validated with the default rule of their dtype on `--images` images: the bundled photos and their deterministic
variants (raggedvit.images.image_variants: flips, crops, scales). Then every mutant of the mutation suite
(raggedvit.validators.mutants: deit_tiny from a checkpoint with random biases, topk-l2 at 3, 6, 9) in the same
dtypes, with its unmutated control: each must fail, its report naming the mutated block, stage, head or (a fault
in the graph's attributes) the structural mismatch.

Cost: the exports run in `--jobs` processes while this one runs the PyTorch references on the CPU (the reference
and its fp16 floor once per model and schedule: fp16 and fp16-all exports share them, `block_reference`), then
validates each export on `--device` (the CUDA EP on a GPU machine), every image in one batch.

Writes <out>/validate_study_<GPU or cpu>.json (overwritten in place): per export pass / fail and its failures, per
mutant caught / named and its first failure, the totals (false failures, mutants missed or not named) and where
the time went. Exit 1 when a clean export fails, a mutant passes or is not named, or an export cannot be made.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.env import environment, result_path

MODELS = ("deit_tiny_patch16_224", "deit_small_patch16_224", "deit_base_patch16_224")
POLICIES = ("topk-l2", "evit", "cls-mass", "tome")
DTYPES = ("fp16", "fp16-all")
IMAGES = 64
# policy -> two prune schedules: PruneSpec.from_dict arguments (cls-mass: exported in the capacity layout)
SCHEDULES: dict[str, tuple[dict[str, Any], ...]] = {
    "topk-l2": (
        {"policy": "topk-l2", "prune_at": [3, 6, 9], "keep": 0.5},
        {"policy": "topk-l2", "prune_at": [4], "keep": 0.5},
    ),
    "evit": (
        {"policy": "evit", "prune_at": [3, 6, 9], "keep": 0.7, "placement": "inside"},  # EViT's drop_loc
        {"policy": "evit", "prune_at": [3], "keep": 0.5, "fuse": True, "placement": "inside"},
    ),
    "cls-mass": (
        {"policy": "cls-mass", "prune_at": [3, 6, 9], "mass": 0.9},
        {"policy": "cls-mass", "prune_at": [4], "mass": 0.8},
    ),
    # tome merges in every block (prune_at empty); in fp16 its merges flip at near-ties: where a false failure hides
    "tome": (
        {"policy": "tome", "prune_at": [], "r": 8},
        {"policy": "tome", "prune_at": [], "r": 16},
    ),
}
CAPACITY_POLICIES = ("cls-mass",)
MAX_FAILURES = 12  # failure messages kept per report in the result file (the count is kept in full)


@dataclass(frozen=True)
class StudyConfig:
    """What one run covers: models x policies x schedules (the first `schedules` of SCHEDULES) x dtypes, on
    `images` images, validated on `device`; `mutants`: names of the mutation suite's mutants to run (None: all)."""

    models: tuple[str, ...] = MODELS
    policies: tuple[str, ...] = POLICIES
    schedules: int = 2
    dtypes: tuple[str, ...] = DTYPES
    images: int = IMAGES
    device: str = "cuda"
    mutants: tuple[str, ...] | None = None
    jobs: int = 1


@dataclass(frozen=True)
class ExportJob:
    """One export: a clean one of `model` (seeded) or, with `checkpoint`, the mutation suite's base model and
    `mutant` (None: its control)."""

    key: str
    path: str
    model: str
    spec: dict[str, Any]
    dtype: str
    capacity: bool = False
    checkpoint: str | None = None
    mutant: str | None = None


@dataclass
class Timing:
    exports_s: float = 0.0  # summed over the export processes
    reference_s: float = 0.0
    validate_s: float = 0.0
    wait_s: float = 0.0  # waiting for an export to finish
    total_s: float = 0.0
    per_model: dict[str, float] = field(default_factory=dict)


_LOADED: dict[tuple[str, str | None], Any] = {}


def _model(model: str, checkpoint: str | None):
    """(vit, recipe) of a seeded timm model or of a checkpoint, loaded once per process."""
    from raggedvit.weights import load_vit

    key = (model, checkpoint)
    if key not in _LOADED:
        vit, info = load_vit(model, checkpoint=checkpoint) if checkpoint else load_vit(model, seed=0)
        _LOADED[key] = (vit, {"model": model, "weights": info.to_dict()})
    return _LOADED[key]


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")


def export_job(job: ExportJob) -> float:
    """Make the export of `job` at job.path; the seconds it took."""
    from raggedvit.exporter import export_onnx
    from raggedvit.pruning import PruneSpec
    from raggedvit.validators.mutants import MUTANTS, export_mutant

    start = time.perf_counter()
    vit, recipe = _model(job.model, job.checkpoint)
    spec = PruneSpec.from_dict(job.spec)
    if job.checkpoint is None:
        export_onnx(vit, spec, job.path, dtype=job.dtype, capacity=job.capacity, recipe=recipe)
    else:
        mutant = None if job.mutant is None else next(m for m in MUTANTS if m.name == job.mutant)
        export_mutant(mutant, vit, spec, recipe, Path(job.path), dtype=job.dtype)
    return time.perf_counter() - start


class _Inline:
    """The pool's interface run in this process, each export when its result is asked for (jobs <= 1)."""

    def __enter__(self) -> _Inline:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def submit(self, fn: Callable[[ExportJob], float], job: ExportJob) -> Future:
        fut: Future = Future()
        fut.result = lambda timeout=None: fn(job)  # type: ignore[method-assign]
        return fut


def _exporter(jobs: int):
    if jobs <= 1:
        return _Inline()
    ctx = multiprocessing.get_context("spawn")  # no fork of a process holding torch threads
    return ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_init_worker)


def _case_key(model: str, spec: dict[str, Any], dtype: str) -> str:
    at = "-".join(str(b) for b in spec["prune_at"]) or "all"
    amount = {"cls-mass": f"mass{spec.get('mass')}", "tome": f"r{spec.get('r')}"}.get(spec["policy"])
    amount = amount or f"keep{spec['keep']}"
    fuse = "-fuse" if spec.get("fuse") else ""
    return f"{model.split('_')[0]}_{model.split('_')[1]}_{spec['policy']}_at{at}_{amount}{fuse}_{dtype}"


def plan(cfg: StudyConfig, work: Path, checkpoint: Path | None) -> tuple[list[ExportJob], list[ExportJob]]:
    """(clean export jobs in study order, mutant jobs: per dtype the control, then every mutant)."""
    from raggedvit.validators.mutants import BASE_SPEC, MODEL, MUTANTS

    clean = []
    for model in cfg.models:
        for policy in cfg.policies:
            for spec in SCHEDULES[policy][: cfg.schedules]:
                for dtype in cfg.dtypes:
                    key = _case_key(model, spec, dtype)
                    clean.append(
                        ExportJob(key, str(work / f"{key}.onnx"), model, spec, dtype, policy in CAPACITY_POLICIES)
                    )
    mutants = []
    if checkpoint is not None:
        names = [m.name for m in MUTANTS if cfg.mutants is None or m.name in cfg.mutants]
        for dtype in cfg.dtypes:
            for name in [None, *names]:
                key = f"mutant_{name or 'control'}_{dtype}"
                path = str(work / f"{key}.onnx")
                mutants.append(ExportJob(key, path, MODEL, BASE_SPEC.to_dict(), dtype, False, str(checkpoint), name))
    return clean, mutants


def _failures(report) -> list[dict[str, Any]]:
    return [asdict(f) for f in report.failures[:MAX_FAILURES]]


def _export_record(job: ExportJob, report, export_s: float, validate_s: float) -> dict[str, Any]:
    ratios = [t["ratio"] for t in report.block_table() if t["ratio"] is not None]
    return {
        "case": job.key,
        "model": job.model,
        "prune": job.spec,
        "capacity": job.capacity,
        "dtype": job.dtype,
        "passed": report.passed,
        "failures": _failures(report),
        "failure_count": len(report.failures),
        "images": len(report.rows),
        "judged": len(report.judged),
        "near_ties": len({t.image for t in report.near_ties}),
        "precision_ties": [asdict(t) for t in report.precision_ties],
        "token_swaps": sum(len(r.token_swaps) for r in report.rows),
        "max_abs_diff": report.max_abs_diff,
        "max_block_ratio": max(ratios, default=None),
        "blocks": report.block_summary(),
        "structure": None if report.structure is None else report.structure.summary(),
        "export_s": round(export_s, 2),
        "validate_s": round(validate_s, 2),
    }


def _mutant_record(job: ExportJob, report, validate_s: float) -> dict[str, Any]:
    from raggedvit.validators.mutants import MUTANTS

    mutant = next(m for m in MUTANTS if m.name == job.mutant)
    return {
        "mutant": mutant.name,
        "dtype": job.dtype,
        "caught": not report.passed,
        # fp16 / fp16-all: a fault under the fp16 floor (LayerNorm eps x100) fails on its structure alone
        "named": (not report.passed) and mutant.named_by(report, per_image_required=job.dtype == "fp32"),
        "expected": {"first": mutant.first, "structure": mutant.structure},
        "first_failure": report.failures[0].message if report.failures else None,
        "failing_images": len({f.image for f in report.failures if f.image is not None}),
        "failures": _failures(report),
        "failure_count": len(report.failures),
        "validate_s": round(validate_s, 2),
    }


def _error_record(job: ExportJob, error: BaseException) -> dict[str, Any]:
    return {"case": job.key, "model": job.model, "prune": job.spec, "dtype": job.dtype, "mutant": job.mutant,
            "error": f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"}  # fmt: skip


class _Study:
    """One run: the export futures, the references, the validations, the records."""

    def __init__(self, cfg: StudyConfig, pool, futures: dict[str, Future], timing: Timing, log) -> None:
        self.cfg, self.pool, self.futures, self.timing, self.log = cfg, pool, futures, timing, log
        self.exports: list[dict[str, Any]] = []
        self.mutants: list[dict[str, Any]] = []
        self.errors: list[dict[str, Any]] = []

    def _made(self, job: ExportJob) -> float | None:
        start = time.perf_counter()
        try:
            seconds = self.futures[job.key].result()
        except Exception as e:  # noqa: BLE001 - an export that cannot be made is a result of the study
            self.errors.append(_error_record(job, e))
            self.log(f"  {job.key}: export failed: {self.errors[-1]['error']}")
            return None
        finally:
            self.timing.wait_s += time.perf_counter() - start
        self.timing.exports_s += seconds
        return seconds

    def _validate(self, job: ExportJob, vit, spec, images, names, rb):
        from raggedvit.validators import load_recipe, validate

        start = time.perf_counter()
        report = validate(
            job.path, images, names, vit=vit, spec=spec, recipe=load_recipe(job.path), device=self.cfg.device,
            batch_size=len(names), floor=False, reference_blocks=rb,
        )  # fmt: skip
        seconds = time.perf_counter() - start
        self.timing.validate_s += seconds
        Path(job.path).unlink(missing_ok=True)
        return report, seconds

    def _references(self, vit, spec, images) -> dict[str, Any]:
        """block_reference per floor of the study's dtypes (fp16 and fp16-all share the fp16 floor)."""
        from raggedvit.validators.blocks import block_reference, floor_dtype_name

        start = time.perf_counter()
        refs: dict[Any, Any] = {}
        out = {}
        for dtype in self.cfg.dtypes:
            floor = floor_dtype_name(dtype)
            if floor not in refs:
                refs[floor] = block_reference(vit, spec, images, dtype, batch_size=images.shape[0])
            out[dtype] = refs[floor]
        self.timing.reference_s += time.perf_counter() - start
        return out

    def clean(self, jobs: list[ExportJob], pairs) -> None:
        from raggedvit.images import preprocess
        from raggedvit.pruning import PruneSpec

        names = [n for n, _ in pairs]
        for model in self.cfg.models:
            start = time.perf_counter()
            vit, _ = _model(model, None)
            images = preprocess(pairs, vit)
            mine = [j for j in jobs if j.model == model]
            for spec_dict in list({json.dumps(j.spec, sort_keys=True): j.spec for j in mine}.values()):
                spec = PruneSpec.from_dict(spec_dict)
                refs = self._references(vit, spec, images)
                for job in (j for j in mine if j.spec == spec_dict):
                    export_s = self._made(job)
                    if export_s is None:
                        continue
                    report, validate_s = self._validate(job, vit, spec, images, names, refs[job.dtype])
                    self.exports.append(_export_record(job, report, export_s, validate_s))
                    verdict = "pass" if report.passed else f"FAIL: {report.failures[0].message}"
                    self.log(f"  {job.key}: {verdict} ({len(report.precision_ties)} precision ties)")
            self.timing.per_model[model] = round(time.perf_counter() - start, 1)

    def mutation_suite(self, jobs: list[ExportJob], pairs, checkpoint: Path) -> None:
        from raggedvit.images import preprocess
        from raggedvit.validators import load_recipe, load_reference

        if not jobs:
            return
        start = time.perf_counter()
        names = [n for n, _ in pairs]
        control = jobs[0]
        if self._made(control) is None:
            return
        ref, spec = load_reference(load_recipe(control.path), checkpoint=checkpoint)
        images = preprocess(pairs, ref)
        refs = self._references(ref, spec, images)
        for job in jobs:
            if job is not control and self._made(job) is None:
                continue
            report, validate_s = self._validate(job, ref, spec, images, names, refs[job.dtype])
            if job.mutant is None:
                self.exports.append(_export_record(job, report, 0.0, validate_s))
                self.log(f"  {job.key}: {'pass' if report.passed else 'FAIL: ' + report.failures[0].message}")
            else:
                rec = _mutant_record(job, report, validate_s)
                self.mutants.append(rec)
                verdict = ("caught" if rec["named"] else "caught, NOT NAMED") if rec["caught"] else "MISSED"
                self.log(f"  {job.key}: {verdict}: {rec['first_failure']}")
        self.timing.per_model["mutation suite"] = round(time.perf_counter() - start, 1)


def totals(exports: list[dict[str, Any]], mutants: list[dict[str, Any]], errors: list[dict[str, Any]]) -> dict:
    """The study's verdict: false failures (clean exports that fail), mutants missed (pass) or not named."""
    return {
        "exports": len(exports),
        "false_failures": sum(not r["passed"] for r in exports),
        "precision_ties": sum(len(r["precision_ties"]) for r in exports),
        "mutants": len(mutants),
        "mutants_missed": sum(not r["caught"] for r in mutants),
        "mutants_not_named": sum(r["caught"] and not r["named"] for r in mutants),
        "export_errors": len(errors),
    }


def run_study(cfg: StudyConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the study of `cfg` in a temporary folder; the result dict (see the module docstring)."""
    import torch

    from raggedvit.images import image_variants, sample_images
    from raggedvit.validators.mutants import write_base_checkpoint

    start = time.perf_counter()
    timing = Timing()
    pairs = image_variants(sample_images(), cfg.images)
    with tempfile.TemporaryDirectory(prefix="validate_study_") as tmp:
        work = Path(tmp)
        checkpoint = None
        if cfg.mutants is None or cfg.mutants:
            checkpoint = work / "mutation_base.pth"
            write_base_checkpoint(checkpoint)
        clean, mutant_jobs = plan(cfg, work, checkpoint)
        threads = torch.get_num_threads()
        if cfg.jobs > 1:  # the export processes take a core each
            torch.set_num_threads(max(1, (os.cpu_count() or 2) - cfg.jobs))
        try:
            with _exporter(cfg.jobs) as pool:
                futures = {job.key: pool.submit(export_job, job) for job in [*clean, *mutant_jobs]}
                study = _Study(cfg, pool, futures, timing, log)
                study.clean(clean, pairs)
                if checkpoint is not None:
                    study.mutation_suite(mutant_jobs, pairs, checkpoint)
        finally:
            torch.set_num_threads(threads)
    timing.total_s = time.perf_counter() - start
    device = torch.cuda.get_device_name(0) if cfg.device == "cuda" else "cpu"
    return {
        "benchmark": "validate_study",
        "env": environment(),
        "device": device,
        "config": {
            **asdict(cfg),
            "schedules": [SCHEDULES[p][: cfg.schedules] for p in cfg.policies],
            "image_names": [n for n, _ in pairs],
            "rule": "the default rule of each export dtype (Thresholds.for_dtype), precision floor off",
        },
        "totals": totals(study.exports, study.mutants, study.errors),
        "exports": study.exports,
        "mutants": study.mutants,
        "errors": study.errors,
        "timing": {k: (round(v, 1) if isinstance(v, float) else v) for k, v in asdict(timing).items()},
    }


def passed(result: dict[str, Any]) -> bool:
    t = result["totals"]
    return not (t["false_failures"] or t["mutants_missed"] or t["mutants_not_named"] or t["export_errors"])


def _names(text: str | None) -> tuple[str, ...] | None:
    return None if text is None else tuple(v for v in text.split(",") if v and v != "none")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--device", default="cuda", choices=("cpu", "cuda"), help="ONNX Runtime EP that validates")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--schedules", type=int, default=2, choices=(1, 2), help="the first N schedules per policy")
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--images", type=int, default=IMAGES, help="the sample photos, then their variants")
    ap.add_argument("--mutants", default=None, help="mutant names, ','-separated ('none': no mutation suite)")
    ap.add_argument("--jobs", type=int, default=min(8, max(1, (os.cpu_count() or 2) // 2)), help="export processes")
    args = ap.parse_args(argv)
    cfg = StudyConfig(
        models=_names(args.models) or (),
        policies=_names(args.policies) or (),
        schedules=args.schedules,
        dtypes=_names(args.dtypes) or (),
        images=args.images,
        device=args.device,
        mutants=_names(args.mutants),
        jobs=args.jobs,
    )
    unknown = [p for p in cfg.policies if p not in SCHEDULES]
    if unknown:
        ap.error(f"unknown policies {unknown} (known: {', '.join(SCHEDULES)})")
    result = run_study(cfg)
    from raggedvit.outputs import atomic_write

    path = result_path(args.out, "validate_study", result["device"])
    atomic_write(path, json.dumps(result, indent=1) + "\n")
    t = result["totals"]
    print(
        f"wrote {path} in {result['timing']['total_s']:.0f} s: {t['exports']} clean exports, {t['false_failures']} "
        f"false failures; {t['mutants']} mutants, {t['mutants_missed']} missed, {t['mutants_not_named']} not named; "
        f"{t['export_errors']} export errors"
    )
    return 0 if passed(result) else 1


if __name__ == "__main__":
    sys.exit(main())
