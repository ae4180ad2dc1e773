"""Exports of the published methods equal the methods' own code on the CPU EP (tests/support/evit_reference.py,
dynamicvit_reference.py: written from youweiliang/evit and raoyongming/DynamicViT): fp32 logits within 1e-5 relative
and equal token counts; `validate` passes on a DynamicViT checkpoint's export; the DynamicViT predictor costs at
most 40 graph nodes over topk-l2 at the same blocks. Seeded weights and predictors: agreement says nothing about
accuracy on trained ones."""

from __future__ import annotations

import functools
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from raggedvit.exporter import export_onnx
from raggedvit.images import preprocess, sample_images
from raggedvit.pruning import PruneSpec
from raggedvit.runtime import create_session
from raggedvit.weights import load_vit
from tests.support.cli import run_cli
from tests.support.dynamicvit_reference import dynamicvit_checkpoint, dynamicvit_reference_forward
from tests.support.evit_reference import evit_reference_forward

pytestmark = pytest.mark.slow
PHOTOS = ("chelsea", "astronaut")


@functools.cache
def _model(name: str) -> torch.nn.Module:
    vit, _ = load_vit(name, seed=0)
    return vit


def _images(vit: torch.nn.Module) -> torch.Tensor:
    pool = dict(sample_images())
    return preprocess([pool[n] for n in PHOTOS], vit)


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("name", ["deit_tiny_patch16_224", "deit_small_patch16_224"])
def test_evit_export_equals_evit(name: str, tmp_path) -> None:
    vit = _model(name)
    x = _images(vit)
    path = export_onnx(vit, PruneSpec("evit", (3, 6, 9), keep=0.7, fuse=True), tmp_path / "evit.onnx")
    logits, counts = create_session(path).run(None, {"images": x.numpy()})
    with torch.no_grad():
        ref = evit_reference_forward(vit, x, 0.7, (3, 6, 9), fuse_token=True)
    np.testing.assert_array_equal(counts, ref.counts.numpy())
    assert _rel(logits, ref.logits) <= 1e-5


def test_dynamicvit_checkpoint_exports_validates_and_equals_dynamicvit(tmp_path: Path) -> None:
    name = "deit_small_patch16_224"
    ckpt = dynamicvit_checkpoint(_model(name), seed=1)
    torch.save(ckpt, tmp_path / "dyvit.pth")
    out = tmp_path / "dyvit.onnx"
    res = run_cli("export", name, "--checkpoint", str(tmp_path / "dyvit.pth"), "--policy", "dynamicvit", "-o", str(out))
    assert res.returncode == 0, res.stderr
    vit, _ = load_vit(name, checkpoint=tmp_path / "dyvit.pth")
    x = _images(vit)
    logits, counts = create_session(out).run(None, {"images": x.numpy()})
    predictor = {k: v for k, v in ckpt["model"].items() if k.startswith("score_predictor.")}
    with torch.no_grad():
        ref = dynamicvit_reference_forward(vit, predictor, x, 0.7, (3, 6, 9))
    np.testing.assert_array_equal(counts, ref.counts.numpy())
    assert _rel(logits, ref.logits) <= 1e-5
    res = run_cli("validate", str(out))  # the reference is built from the same checkpoint, predictor included
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    assert "validation: PASS" in res.stdout and "dynamicvit keep=0.7 at=3,6,9" in res.stdout
    # the node budget: the predictor costs at most 40 nodes over topk-l2's scorer at the same blocks
    topk = export_onnx(_model(name), PruneSpec("topk-l2", (3, 6, 9), keep=0.7), tmp_path / "topk.onnx")
    nodes = {p.stem: len(onnx.load(str(p), load_external_data=False).graph.node) for p in (out, topk)}
    assert nodes["dyvit"] - nodes["topk"] <= 40, nodes
    ops = Counter(n.op_type for n in onnx.load(str(out), load_external_data=False).graph.node)
    assert "NonZero" not in ops and ops["RaggedSelect"] == 3  # static shapes: a CUDA graph


def test_dynamicvit_without_predictor_keys_and_under_another_policy(tmp_path: Path) -> None:
    name = "deit_tiny_patch16_224"
    ckpt = dynamicvit_checkpoint(_model(name), seed=1)
    backbone = {k: v for k, v in ckpt["model"].items() if not k.startswith("score_predictor.")}
    torch.save({"model": backbone}, tmp_path / "plain.pth")
    res = run_cli("export", name, "--checkpoint", str(tmp_path / "plain.pth"), "--policy", "dynamicvit",
                  "-o", str(tmp_path / "m.onnx"))  # fmt: skip
    assert res.returncode == 2 and not (tmp_path / "m.onnx").exists()
    assert "needs its predictor weights in the checkpoint" in res.stderr
    assert "missing: score_predictor.0.in_conv.0.weight" in res.stderr
    torch.save(ckpt, tmp_path / "dyvit.pth")
    res = run_cli("export", name, "--checkpoint", str(tmp_path / "dyvit.pth"), "--policy", "topk-l2",
                  "-o", str(tmp_path / "t.onnx"))  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "note: the checkpoint's dynamicvit predictor (30 keys: score_predictor.0.in_conv.0.bias, ...)" in res.stderr
    assert "is ignored by --policy topk-l2; its backbone is loaded" in res.stderr


def test_a_tome_checkpoint_as_its_training_saves_it_exports_with_tome(tmp_path: Path) -> None:
    """ToMe's fine-tuned DeiTs are timm state dicts saved by DeiT's training script: {"model", "optimizer",
    "lr_scheduler", "epoch", "scaler", "args" (an argparse Namespace)}. It loads with --policy tome, and the export
    equals ToMe's code (tests/support/tome_reference.py) on the CPU EP."""
    import argparse

    from tests.support.tome_reference import tome_reference_forward

    name = "deit_tiny_patch16_224"
    vit = _model(name)
    saved = {
        "model": vit.state_dict(),
        "optimizer": {"state": {}, "param_groups": [{"lr": 1e-5, "weight_decay": 0.05, "params": [0, 1]}]},
        "lr_scheduler": {"last_epoch": 29},
        "epoch": 29,
        "scaler": {"scale": 65536.0, "growth_factor": 2.0},
        "args": argparse.Namespace(model=name, r=8, lr=1e-5, epochs=30),
    }
    torch.save(saved, tmp_path / "tome_deit.pth")
    out = tmp_path / "tome.onnx"
    res = run_cli("export", name, "--checkpoint", str(tmp_path / "tome_deit.pth"), "--policy", "tome", "--r", "8",
                  "-o", str(out))  # fmt: skip
    assert res.returncode == 0, res.stderr
    loaded, info = load_vit(name, checkpoint=tmp_path / "tome_deit.pth")
    assert info.source == "checkpoint"
    x = _images(loaded)
    logits, counts = create_session(out).run(None, {"images": x.numpy()})
    with torch.no_grad():
        ref = tome_reference_forward(loaded, x, 8)
    assert counts.tolist() == [[t.shape[1] for t in ref.token_index]] * x.shape[0]
    assert _rel(logits, ref.logits) <= 1e-5
