"""Mutation suite: every export fault must make `validate` fail under the default rule of the export's
dtype, naming the failing images, or (a fault written in the graph's attributes) the block and the attribute.

Each mutant is an export of a changed copy of the model (or spec) whose metadata carries the ORIGINAL recipe
(raggedvit/validators/mutants.py), validated against the original checkpoint. CI runs the fp32 exports on the CPU
EP, and the fp16-all LayerNorm-epsilon mutant (below the fp16 floor: only the structural check sees it); the
fp16 / fp16-all cases run on the CUDA EP in the GPU checks (`pytest -m gpu`). No mutant is an expected failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import onnxruntime as ort
import pytest
import torch

from raggedvit.images import preprocess, sample_images
from raggedvit.validators import block_reference, load_recipe, load_reference, validate
from raggedvit.validators.mutants import (
    BASE_SPEC,
    DYNAMICVIT_MUTANTS,
    DYNAMICVIT_SPEC,
    MUTANTS,
    TOME_MUTANTS,
    TOME_SPEC,
    Mutant,
    export_mutant,
    write_base_checkpoint,
)

ROOT = Path(__file__).resolve().parents[2]
_CUDA = torch.cuda.is_available() and "CUDAExecutionProvider" in ort.get_available_providers()
_GPU = [pytest.mark.gpu, pytest.mark.skipif(not _CUDA, reason="needs CUDA and onnxruntime's CUDA EP")]
# each target is an xdist group of its own (`--dist loadgroup`): its module fixtures run once, on one worker, and the
# targets run side by side
TARGETS = [
    pytest.param(("cpu", "fp32"), id="cpu-fp32", marks=pytest.mark.xdist_group("cpu-fp32")),
    pytest.param(("cuda", "fp16"), id="cuda-fp16", marks=[*_GPU, pytest.mark.xdist_group("cuda-fp16")]),
    pytest.param(("cuda", "fp16-all"), id="cuda-fp16-all", marks=[*_GPU, pytest.mark.xdist_group("cuda-fp16-all")]),
]


pytestmark = pytest.mark.xdist_group("test_mutations")  # with a target's group: see TARGETS


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """(checkpoint path, original vit, its recipe, images [7, 3, 224, 224], names)."""
    ckpt = tmp_path_factory.mktemp("mutants") / "base.pth"
    vit, recipe = write_base_checkpoint(ckpt)
    pairs = sample_images()
    assert len(pairs) >= 5, "needs the sample photos of scikit-image / scikit-learn / matplotlib"
    return ckpt, vit, recipe, preprocess(pairs, vit), [n for n, _ in pairs]


@pytest.fixture(scope="module", params=TARGETS)
def target(request, base, tmp_path_factory):
    """(device, dtype, reference vit rebuilt from the checkpoint, report of the unmutated export, the reference and
    floor runs of the per-block rule)."""
    device, dtype = request.param
    ckpt, vit, recipe, images, names = base
    path = export_mutant(None, vit, BASE_SPEC, recipe, tmp_path_factory.mktemp(dtype) / "control.onnx", dtype=dtype)
    ref, spec = load_reference(load_recipe(path), checkpoint=ckpt)
    assert spec == BASE_SPEC
    blocks = block_reference(ref, spec, images, dtype)  # the same for every mutant of this target
    control = validate(
        path,
        images,
        names,
        vit=ref,
        spec=spec,
        recipe=load_recipe(path),
        device=device,
        floor=False,
        reference_blocks=blocks,
    )
    return device, dtype, ref, control, blocks


def test_control_passes(target):
    *_, control, _ = target
    assert control.passed, control.to_markdown()


def _validate_mutant(mutant: Mutant, base, target, tmp_path):
    _, vit, recipe, images, names = base
    device, dtype, ref, _, blocks = target
    path = export_mutant(mutant, vit, BASE_SPEC, recipe, tmp_path / f"{mutant.name}.onnx", dtype=dtype)
    stored = load_recipe(path)
    assert stored["prune"] == BASE_SPEC.to_dict() and stored["dtype"] == dtype  # the file hides the fault
    return validate(
        path, images, names, vit=ref, spec=BASE_SPEC, recipe=stored, device=device, floor=False, reference_blocks=blocks
    )


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_fails_naming_images(mutant, base, target, tmp_path):
    names = base[4]
    device, dtype, _, control, _ = target
    report = _validate_mutant(mutant, base, target, tmp_path)
    if dtype == "fp32":  # the mutation is real: far beyond the unmutated export's drift, or other token counts
        assert report.max_abs_diff > 20 * control.max_abs_diff or report.counts_agreement < 1, report.to_markdown()
    if report.passed:
        pytest.fail(
            f"validate passed {mutant.name}: max |Δlogit| {report.max_abs_diff:.3e}; {report.thresholds.text()}"
        )
    # the structural failures name the mutant's attribute (and only a structural mutant has any); each failing
    # image's first failure names its block / stage / head; LayerNorm eps x100 moves an fp16 residual stream by half
    # the fp16 floor: its failure is the structural one alone
    assert mutant.named_by(report, per_image_required=dtype == "fp32"), report.to_markdown()
    assert report.structure is not None and report.structure.checks
    per_image = [f for f in report.failures if f.image is not None]
    if dtype == "fp32":  # far past the fp32 bar: every judged image fails
        assert {f.image for f in per_image} == {r.index for r in report.judged}, report.to_markdown()
    for f in per_image:
        assert f"image {f.image} ({names[f.image]})" in f.message
    md = report.to_markdown()
    assert md.startswith("## raggedvit validation: FAIL") and all(f.message in md for f in report.failures)


def test_layernorm_eps_fails_in_fp16_on_the_cpu_ep(base, tmp_path):
    """fp16-all on the CPU EP, where the mutant's drift stays under the fp16 floor (0.53x): the structural check
    fails it, naming each block's norm epsilon."""
    ckpt, vit, recipe, images, names = base
    mutant = next(m for m in MUTANTS if m.name == "layernorm_eps_x100")
    path = export_mutant(mutant, vit, BASE_SPEC, recipe, tmp_path / "m.onnx", dtype="fp16-all")
    ref, spec = load_reference(load_recipe(path), checkpoint=ckpt)
    report = validate(path, images, names, vit=ref, spec=spec, recipe=load_recipe(path), floor=False)
    assert not report.passed and mutant.named_by(report, per_image_required=False), report.to_markdown()
    structural = [f for f in report.failures if f.kind == "structure"]
    depth = len(vit.blocks)
    assert [f.message.split(":")[1].strip() for f in structural] == [f"block {b}" for b in range(depth)] + ["the head"]
    assert "- structure (the graph's attributes against the reference's modules):" in report.to_markdown()


@pytest.fixture(scope="module")
def tome_target(base, tmp_path_factory):
    """The tome target (CPU EP, fp32): (reference vit rebuilt from the checkpoint, report of the unmutated export,
    the reference and floor runs of the per-block rule)."""
    ckpt, vit, recipe, images, names = base
    path = export_mutant(None, vit, TOME_SPEC, recipe, tmp_path_factory.mktemp("tome") / "control.onnx")
    ref, spec = load_reference(load_recipe(path), checkpoint=ckpt)
    assert spec == TOME_SPEC
    blocks = block_reference(ref, spec, images, "fp32")
    control = validate(
        path, images, names, vit=ref, spec=spec, recipe=load_recipe(path), floor=False, reference_blocks=blocks
    )
    return ref, control, blocks


@pytest.mark.xdist_group("cpu-fp32-tome")
def test_tome_control_passes(tome_target):
    _, control, _ = tome_target
    assert control.passed, control.to_markdown()


@pytest.mark.xdist_group("cpu-fp32-tome")
@pytest.mark.parametrize("mutant", TOME_MUTANTS, ids=[m.name for m in TOME_MUTANTS])
def test_tome_mutant_fails_naming_images(mutant, base, tome_target, tmp_path):
    """Token merging faults (proportional attention dropped, unweighted averages, the sets or the metric changed,
    one more token merged) fail every judged image of a tome export, each naming the first block or stage the fault
    reaches (the weight faults of MUTANTS are the same for every policy)."""
    _, vit, recipe, images, names = base
    ref, control, blocks = tome_target
    path = export_mutant(mutant, vit, TOME_SPEC, recipe, tmp_path / f"{mutant.name}.onnx")
    stored = load_recipe(path)
    assert stored["prune"] == TOME_SPEC.to_dict()  # the file hides the fault
    report = validate(path, images, names, vit=ref, spec=TOME_SPEC, recipe=stored, floor=False, reference_blocks=blocks)
    assert report.max_abs_diff > 20 * control.max_abs_diff or report.counts_agreement < 1, report.to_markdown()
    assert not report.passed, report.to_markdown()
    per_image = [f for f in report.failures if f.image is not None]
    assert {f.image for f in per_image} == {r.index for r in report.judged}, report.to_markdown()
    assert mutant.named_by(report, per_image_required=True), report.to_markdown()
    assert all(f"image {f.image} ({names[f.image]})" in f.message for f in per_image), report.to_markdown()


@pytest.fixture(scope="module")
def dynamicvit_target(base, tmp_path_factory):
    """The dynamicvit target (CPU EP, fp32): a DynamicViT checkpoint (the base model + seeded predictors), its vit,
    recipe, reference vit rebuilt from it, the report of the unmutated export and the per-block reference runs."""
    _, _, _, images, names = base
    ckpt = tmp_path_factory.mktemp("dynamicvit") / "dyvit.pth"
    vit, recipe = write_base_checkpoint(ckpt, predictor=True)
    path = export_mutant(None, vit, DYNAMICVIT_SPEC, recipe, ckpt.with_name("control.onnx"))
    ref, spec = load_reference(load_recipe(path), checkpoint=ckpt)
    assert spec == DYNAMICVIT_SPEC
    blocks = block_reference(ref, spec, images, "fp32")
    control = validate(
        path, images, names, vit=ref, spec=spec, recipe=load_recipe(path), floor=False, reference_blocks=blocks
    )
    return vit, recipe, ref, control, blocks


@pytest.mark.xdist_group("cpu-fp32-dynamicvit")
def test_dynamicvit_control_passes(dynamicvit_target):
    assert dynamicvit_target[3].passed, dynamicvit_target[3].to_markdown()


@pytest.mark.xdist_group("cpu-fp32-dynamicvit")
@pytest.mark.parametrize("mutant", DYNAMICVIT_MUTANTS, ids=[m.name for m in DYNAMICVIT_MUTANTS])
def test_dynamicvit_mutant_fails_naming_images(mutant, base, dynamicvit_target, tmp_path):
    """Learned-predictor faults (a predictor weight nudged, the global half not averaged, the stages' predictors
    swapped) fail the images whose kept tokens they change (a nudge moves the cut of some images only), each naming
    the first stage it reaches."""
    _, _, _, images, names = base
    vit, recipe, ref, control, blocks = dynamicvit_target
    path = export_mutant(mutant, vit, DYNAMICVIT_SPEC, recipe, tmp_path / f"{mutant.name}.onnx")
    stored = load_recipe(path)
    assert stored["prune"] == DYNAMICVIT_SPEC.to_dict()  # the file hides the fault
    report = validate(
        path, images, names, vit=ref, spec=DYNAMICVIT_SPEC, recipe=stored, floor=False, reference_blocks=blocks
    )
    assert not report.passed, report.to_markdown()
    per_image = [f for f in report.failures if f.image is not None]
    assert per_image and mutant.named_by(report, per_image_required=True), [f.message for f in report.failures]


def test_cli_exits_1_and_names_the_images(base, target, tmp_path):
    """The command line on a mutant (one more token kept at the first stage): exit 1, every image named."""
    ckpt, vit, recipe, _, names = base
    device, dtype, *_ = target
    mutant = next(m for m in MUTANTS if m.name == "keep_one_more_token")
    path = export_mutant(mutant, vit, BASE_SPEC, recipe, tmp_path / "m.onnx", dtype=dtype)
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "GITHUB_STEP_SUMMARY": str(summary),
    }
    junit = tmp_path / "validate.xml"
    args = ["validate", str(path), "--sample-images", "--checkpoint", str(ckpt), "--device", device, "--no-floor"]
    args += ["--junit-xml", str(junit)]
    res = subprocess.run(
        [sys.executable, "-m", "raggedvit", *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300
    )
    assert res.returncode == 1, res.stdout + res.stderr
    assert "## raggedvit validation: FAIL" in res.stdout and res.stderr == ""
    for i, name in enumerate(names):  # a failure for each image, or its listing as a near-tie
        failed = f"token_counts: image {i} ({name}): token_counts" in res.stdout
        assert failed or f"- image {i}, stage" in res.stdout, res.stdout
    assert "moved at stage 0 (block 3) by +1 token: topk-l2 keeps ceil(P x keep) tokens" in res.stdout
    assert summary.read_text() == "earlier step\n" + res.stdout + "\n"  # appended to the step summary
    suite = ET.parse(junit).getroot().find("testsuite")
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == [f"image {i} ({n})" for i, n in enumerate(names)] + [
        "structure",
        "validation rule",
    ]
    failed = [c for c in cases if c.find("failure") is not None]
    assert failed and cases[-1] in failed and int(suite.get("failures")) == len(failed)
    for case in failed[:-1]:  # each failed image names the moved stage first
        assert "moved at stage 0 (block 3)" in case.find("failure").get("message")
