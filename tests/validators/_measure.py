"""The figures behind the per-block rule's constants (DESIGN.md section 6), one table row per export:
`python3 -m tests.validators._measure mutants fp32|fp16|fp16-all` (the mutation suite's exports on the CPU EP) or
`python3 -m tests.validators._measure clean MODEL...` (seeded timm models x topk-l2, cls-mass, evit+fuse, fp32) or
`python3 -m tests.validators._measure families` (test_families.py's models, every sample photo)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from raggedvit.exporter import export_onnx
from raggedvit.images import preprocess, sample_images
from raggedvit.pruning import PruneSpec
from raggedvit.validators import load_recipe, validate
from raggedvit.validators.mutants import BASE_SPEC, MUTANTS, export_mutant, write_base_checkpoint
from raggedvit.validators.report import ValidationReport
from raggedvit.weights import load_vit

CLEAN_SPECS = {
    "topk-l2": PruneSpec("topk-l2", (3, 6, 9), keep=0.5),
    "cls-mass": PruneSpec("cls-mass", (3, 6, 9), mass=0.9),
    "evit+fuse": PruneSpec("evit", (3, 6, 9), keep=0.7, fuse=True),
}


def _row(what: str, rep: ValidationReport) -> str:
    ratios = [t["ratio"] for t in rep.block_table() if t["ratio"] is not None]
    first = {}
    for f in rep.failures:
        if f.image is not None:
            first.setdefault(f.image, f.kind)
    return (
        f"| {what} | {'PASS' if rep.passed else 'FAIL'} | {len(first)}/{len(rep.judged)} judged images fail "
        f"| {rep.block_summary()} | max block ratio {max(ratios, default=0):.3g} | max |Δlogit| {rep.max_abs_diff:.2e} "
        f"| logit bar {rep.thresholds.max_abs_logit:.3g} |"
    )


def mutants(dtype: str, work: Path) -> None:
    vit, recipe = write_base_checkpoint(work / "base.pth")
    pairs = sample_images()
    images, names = preprocess(pairs, vit), [n for n, _ in pairs]
    for m in [None, *MUTANTS]:
        path = export_mutant(m, vit, BASE_SPEC, recipe, work / f"{m.name if m else 'control'}.onnx", dtype=dtype)
        rep = validate(path, images, names, vit=vit, spec=BASE_SPEC, recipe=load_recipe(path), floor=False)
        print(_row(f"{dtype} {m.name if m else 'control'}", rep), flush=True)


def clean(models: list[str], work: Path) -> None:
    pairs = sample_images()
    for model in models:
        vit, info = load_vit(model, seed=0)
        images, names = preprocess(pairs, vit), [n for n, _ in pairs]
        for policy, spec in CLEAN_SPECS.items():
            path = export_onnx(vit, spec, work / f"{policy}.onnx", recipe={"model": model, "weights": info.to_dict()})
            rep = validate(path, images, names, vit=vit, spec=spec, recipe=load_recipe(path))
            print(_row(f"{model} {policy}", rep), flush=True)


def families() -> None:
    from raggedvit.coverage.model import reduced_model

    from .test_families import FAMILIES

    pairs = sample_images()
    spec = PruneSpec("topk-l2", (1,), keep=0.5)
    with tempfile.TemporaryDirectory() as tmp:
        for name in FAMILIES:
            vit, _ = reduced_model(name, depth=2, img_size=64)
            vit = vit.float().eval()
            path = export_onnx(vit, spec, Path(tmp) / "m.onnx", recipe={"model": name})
            images, names = preprocess(pairs, vit), [n for n, _ in pairs]
            print(_row(name, validate(path, images, names, vit=vit, spec=spec, recipe=load_recipe(path))), flush=True)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        if sys.argv[1] == "mutants":
            mutants(sys.argv[2], Path(tmp))
        elif sys.argv[1] == "families":
            families()
        else:
            clean(sys.argv[2:], Path(tmp))
