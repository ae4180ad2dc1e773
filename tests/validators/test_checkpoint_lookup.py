"""Where validate finds an export's checkpoint: --checkpoint, then relative to the model file, then the current
directory; a moved checkpoint is exit 2 naming both places tried, another file's sha256 is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from raggedvit.cli import main
from raggedvit.exporter.metadata import checkpoint_relpath
from raggedvit.validators import ValidationInputError
from raggedvit.validators.reference import find_checkpoint, load_recipe
from raggedvit.weights import load_vit, sha256_file

MODEL = "deit_tiny_patch16_224"


def test_relpath_is_relative_to_the_model_directory(tmp_path):
    assert checkpoint_relpath(tmp_path / "data" / "ck.pth", tmp_path / "out" / "m.onnx") == "../data/ck.pth"
    assert checkpoint_relpath(tmp_path / "ck.pth", tmp_path / "m.onnx") == "ck.pth"


def test_lookup_order(tmp_path, monkeypatch):
    model = tmp_path / "out" / "m.onnx"
    model.parent.mkdir()
    beside = tmp_path / "data" / "ck.pth"
    beside.parent.mkdir()
    beside.write_bytes(b"weights")
    weights = {"checkpoint": "ck.pth", "checkpoint_relpath": "../data/ck.pth", "checkpoint_sha256": sha256_file(beside)}
    here = tmp_path / "cwd"
    here.mkdir()
    monkeypatch.chdir(here)
    assert find_checkpoint(weights, model, None) == model.parent / "../data/ck.pth"
    shutil.copy(beside, here / "ck.pth")
    beside.unlink()
    assert find_checkpoint(weights, model, None) == Path("ck.pth")  # the current directory comes next
    (here / "ck.pth").unlink()
    with pytest.raises(ValidationInputError) as e:
        find_checkpoint(weights, model, None)
    msg = str(e.value)
    assert "\n" not in msg and "relative to the model" in msg and "in the current directory" in msg
    assert str(model.parent / "../data/ck.pth") in msg and "'ck.pth'" in msg
    other = tmp_path / "other.pth"
    other.write_bytes(b"other weights")
    with pytest.raises(ValidationInputError, match="not the exported weights"):
        find_checkpoint(weights, model, other)


def test_export_and_validate_from_other_directories(tmp_path, monkeypatch):
    """export --checkpoint data/ck.pth -o out/m.onnx; validate out/m.onnx from a third directory."""
    vit, _ = load_vit(MODEL, seed=0, img_size=64)
    data, out, elsewhere = (tmp_path / d for d in ("data", "out", "elsewhere"))
    for d in (data, out, elsewhere):
        d.mkdir()
    ckpt = data / "ck.pth"
    torch.save({k: v.contiguous() for k, v in vit.state_dict().items()}, ckpt)
    runner = CliRunner()
    monkeypatch.chdir(data)
    args = ["export", MODEL, "--checkpoint", "ck.pth", "-o", str(out / "m.onnx"), "--img-size", "64"]
    res = runner.invoke(main, [*args, "--prune-at", "1", "--keep", "0.5"])
    assert res.exit_code == 0, res.output
    weights = load_recipe(out / "m.onnx")["weights"]
    assert weights["checkpoint_relpath"] == "../data/ck.pth" and weights["checkpoint"] == "ck.pth"
    assert str(tmp_path) not in json.dumps(weights)  # never an absolute path
    monkeypatch.chdir(elsewhere)
    validate = ["validate", "../out/m.onnx", "--random", "2"]
    res = runner.invoke(main, validate)
    assert res.exit_code == 0, res.output
    assert "| block | max drift | fp32 floor | ratio |" in res.output
    moved = tmp_path / "moved.pth"
    ckpt.rename(moved)
    res = runner.invoke(main, validate)
    assert res.exit_code == 2, res.output
    line = res.output.strip()
    assert "\n" not in line and "relative to the model" in line and "in the current directory" in line, line
    torch.save({k: v + 1 for k, v in vit.state_dict().items()}, ckpt)
    res = runner.invoke(main, validate)
    assert res.exit_code == 2 and "not the exported weights" in res.output, res.output
    res = runner.invoke(main, [*validate, "--checkpoint", str(moved)])
    assert res.exit_code == 0, res.output
