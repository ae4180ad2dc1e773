"""raggedvit CLI: success paths, exit codes, one-line errors, no partial output. Most calls run in this process
through click's runner (`run_cli`: the same error mapping, no Python start and torch import each); `raggedvit info`,
the corrupt checkpoint, an op library named by the environment and the model without a recipe go through the
console entry point in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import CliResult, run_cli

ROOT = Path(__file__).resolve().parents[2]
MODEL = "deit_tiny_patch16_224"


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    e = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {})}
    e.pop("RAGGEDVIT_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "raggedvit", *args], capture_output=True, text=True, env=e, cwd=ROOT, timeout=300
    )


def assert_error(res: subprocess.CompletedProcess | CliResult, code: int, fragment: str) -> None:
    lines = res.stderr.strip().splitlines()
    assert res.returncode == code, res.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], res.stderr


# one pytest-xdist worker runs this module (`--dist loadgroup`), so its module fixtures run once
pytestmark = pytest.mark.xdist_group("test_cli")


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """The export every validate test reads, with a name of 255 bytes (the file system's limit: the temp names used
    to add 10 and fail after the export) and, the external-data threshold lowered to 1 MiB, its weights in a data file
    beside it (the size line names both files and gives their total)."""
    from raggedvit.exporter import saving
    from raggedvit.exporter.files import external_data_name

    out = tmp_path_factory.mktemp("cli") / ("m" * 250 + ".onnx")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(saving, "EXTERNAL_DATA_BYTES", 1 << 20)
        res = run_cli("export", MODEL, "--seed", "0", "--policy", "topk-l2", "--prune-at", "4", "-o", str(out))
    assert res.returncode == 0, res.stderr
    data = out.parent / external_data_name(out)
    assert sorted(p.name for p in out.parent.iterdir()) == sorted([out.name, data.name])
    total = (out.stat().st_size + data.stat().st_size) / 2**20
    assert f"wrote {out} and {data} ({MODEL}, topk-l2, fp32, {total:.1f} MiB in all; static shapes" in res.stdout
    assert total > 20 and out.stat().st_size < 1 << 20  # deit_tiny's 22 MB of weights are in the data file
    return out


def test_validate_pass_and_report(exported, tmp_path):
    res = run_cli("validate", str(exported), "--sample-images", "--report", str(tmp_path / "rep"))
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("## raggedvit validation: PASS")
    data = json.loads((tmp_path / "rep.json").read_text())
    assert data["passed"] and data["summary"]["token_counts_agreement"] == 1.0
    assert (tmp_path / "rep.md").read_text() == res.stdout


def test_validate_images_of_every_kind(exported, tmp_path):
    """A folder with a JPEG, a GIF (its first frame), a 16-bit PNG (scaled to 8 bits) and a text file: the three
    images are judged, the text file is named in one warning line."""
    import numpy as np
    from PIL import Image

    from raggedvit.images import sample_images

    photo = dict(sample_images())["chelsea"]
    photo.save(tmp_path / "cat.jpg")
    photo.convert("P").save(tmp_path / "cat_gif.gif")
    gray16 = (np.asarray(photo.convert("L"), np.uint16) * 257).astype(np.uint16)
    Image.fromarray(gray16).save(tmp_path / "cat16.png")
    (tmp_path / "notes.txt").write_text("not an image")
    res = run_cli("validate", str(exported), "--images", str(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "| 3 | 3 |" in res.stdout and "| cat_gif |" in res.stdout and "| cat16 |" in res.stdout, res.stdout
    warnings = [ln for ln in res.stderr.splitlines() if ln.startswith("warning: ")]
    assert warnings == [f"warning: --images {tmp_path}: skipped 1 entry: notes.txt (not an image suffix: .jpg, "
                        ".jpeg, .png, .bmp, .webp, .tif, .tiff, .gif)"], res.stderr  # fmt: skip


def test_validate_numerical_failure_exits_1(exported):
    res = run_cli("validate", str(exported), "--random", "2", "--atol", "1e-12", "--tie-eps", "0")
    assert res.returncode == 1, res.stderr
    assert "## raggedvit validation: FAIL" in res.stdout and "max_abs_logit" in res.stdout
    # the same bar plus a relative part that covers the fp32 drift passes
    res = run_cli("validate", str(exported), "--random", "2", "--atol", "1e-12", "--rtol", "1e-3", "--tie-eps", "0")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "max |Δlogit| ≤ 1e-12 + 0.001 x max |reference logit| [atol 1e-12 (given), rtol 0.001 (given)" in res.stdout


def test_capacity_export_is_capturable_and_validates(tmp_path):
    """cls-mass in the capacity layout: static shapes (the export says so), and it passes validate."""
    out = tmp_path / "cap.onnx"
    args = ("--seed", "0", "--policy", "cls-mass", "--prune-at", "4", "--capacity", "--diagnostics", "-o", str(out))
    res = run_cli("export", MODEL, *args)
    assert res.returncode == 0, res.stderr
    assert "CUDA-graph capturable" in res.stdout
    res = run_cli("validate", str(out), "--random", "2")
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith("## raggedvit validation: PASS")


def test_info():
    res = cli("info")
    assert res.returncode == 0, res.stderr
    for word in ("raggedvit", "torch", "triton", "timm", "onnxruntime", "ORT providers", "GPU", "op library"):
        assert word in res.stdout
    listed = res.stdout.split("\ncubins\n", 1)[1].splitlines()  # one line per CUDA op: its cubins and archs
    ops = ("RaggedAttention", "RaggedLinear", "RaggedSelect", "BiasGelu", "GatherLayerNorm", "PatchEmbed")
    ops += ("RaggedMerge",)
    assert [line.split()[0] for line in listed] == list(ops)
    assert all(int(line.split()[1]) > 0 and "sm_90" in line for line in listed)


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["nosuchmodel"], "unknown timm model 'nosuchmodel'"),
        (["resnet18"], "not a ViT raggedvit runs"),
        ([MODEL, "--keep", "1.5"], "keep must be in (0, 1]"),
        ([MODEL, "--policy", "cls-mass", "--mass", "0"], "mass must be in (0, 1]"),
        ([MODEL, "--prune-at", "12"], "out of range 1..11"),
        ([MODEL, "--prune-at", "4,x"], "comma-separated block indices"),
        ([MODEL, "--policy", "topk-l2", "--fuse"], "fuse is only defined for policy 'evit'"),
        ([MODEL, "--policy", "bogus"], "Invalid value for '--policy'"),
        ([MODEL, "--seed", "1", "--pretrained"], "at most one of --checkpoint, --pretrained, --seed"),
        ([MODEL, "--checkpoint", "/nonexistent/w.pth"], "does not exist"),
        ([MODEL, "--ragged-linear"], "--ragged-linear: ragged linear needs an fp16 / fp16-all export"),
    ],
)
def test_export_errors(tmp_path, args, fragment):
    out = tmp_path / "o.onnx"
    assert_error(run_cli("export", *args, "-o", str(out)), 2, fragment)  # in this process: the same error mapping
    assert list(tmp_path.iterdir()) == []


def test_export_corrupt_checkpoint(tmp_path):
    ckpt = tmp_path / "w.pth"
    ckpt.write_bytes(b"\x00garbage, not a torch file")
    assert_error(cli("export", MODEL, "--checkpoint", str(ckpt), "-o", str(tmp_path / "o.onnx")), 2, "w.pth")
    assert [p.name for p in tmp_path.iterdir()] == ["w.pth"]


def test_export_unwritable_path(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert_error(run_cli("export", MODEL, "-o", str(tmp_path / "missing" / "o.onnx")), 2, "does not exist")
    assert_error(run_cli("export", MODEL, "-o", str(blocker / "o.onnx")), 2, "cannot write output")
    assert_error(run_cli("export", MODEL, "-o", str(tmp_path)), 2, "")
    assert [p.name for p in tmp_path.iterdir()] == ["file"]


def test_validate_errors(exported, tmp_path):
    assert_error(run_cli("validate", str(tmp_path / "none.onnx")), 2, "does not exist")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"garbage")
    assert_error(run_cli("validate", str(bad)), 2, "not a readable ONNX model")
    assert_error(run_cli("validate", str(exported), "--random", "2", "--sample-images"), 2, "at most one of")
    assert_error(run_cli("validate", str(exported), "--images", str(tmp_path / "nodir")), 2, "does not exist")
    assert_error(run_cli("validate", str(exported), "--report", str(tmp_path / "no" / "r")), 2, "cannot write report")
    assert_error(run_cli("validate", str(exported), "--random", "1", "--floor"), 2, "no precision floor")
    assert_error(run_cli("validate", str(exported), "--rtol", "-1"), 2, "--rtol must be >= 0")
    missing = {"RAGGEDVIT_ORT_LIBRARY": str(tmp_path / "libnone.so")}
    assert_error(cli("validate", str(exported), env=missing), 2, "op library missing")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.onnx"]


def test_validate_model_without_recipe(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    m = helper.make_model(g)
    m.ir_version = 10
    onnx.save(m, tmp_path / "plain.onnx")
    assert_error(cli("validate", str(tmp_path / "plain.onnx")), 2, "not exported by raggedvit")
