"""engine="block" exports: one com.raggedvit::RaggedViTBlock node per block (weights as initializers) for every
policy, the CPU EP session against PrunedViT, deit_tiny / deit_small / deit_base blocks (3 of them, 64-pixel images)
through `validate` on the CPU EP, and `raggedvit export --engine block` passing `raggedvit validate`."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
import torch

from raggedvit.exporter.export import build_model
from raggedvit.pruning import PrunedViT, PruneSpec
from raggedvit.weights import load_vit
from tests.support.cli import CliResult, run_cli

from .conftest import to_proto

ROOT = Path(__file__).resolve().parents[2]
DEPTH = 4
SPECS = {
    "topk-l2": (PruneSpec.from_strings("topk-l2", "1,3", 0.5, 0.9, False), False),
    "cls-mass-capacity": (PruneSpec.from_strings("cls-mass", "1,3", 0.5, 0.9, False), True),
    "evit-fuse": (PruneSpec.from_strings("evit", "1,3", 0.5, 0.9, True), False),
}


@pytest.fixture(scope="module")
def small_vit():
    vit, _ = load_vit("deit_tiny_patch16_224", seed=0, model_kwargs={"depth": DEPTH})
    return vit


def _ops(model: ir.Model) -> Counter:
    return Counter(f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in model.graph)


@pytest.mark.parametrize("name", list(SPECS))
def test_one_node_per_block(small_vit, name: str) -> None:
    spec, capacity = SPECS[name]
    model = build_model(small_vit, spec, capacity=capacity, engine="block")
    ops = _ops(model)
    assert ops["com.raggedvit::RaggedViTBlock"] == DEPTH, ops
    assert not ops["com.raggedvit::RaggedAttention"], ops
    # MatMul: the embedding's, the head's, evit's fused token per stage; LayerNormalization: the head's
    assert ops["MatMul"] <= 2 + len(spec.prune_at) and ops["LayerNormalization"] <= 1, ops
    assert model.ir_version <= 13 and model.opset_imports["com.raggedvit"] == 1
    assert ir.to_proto(model).metadata_props  # the recipe
    blocks = [n for n in model.graph if n.op_type == "RaggedViTBlock"]
    for node in blocks:
        assert node.attributes["num_heads"].value == 3
        assert node.attributes["epsilon"].value == pytest.approx(1e-6)
        assert node.attributes["scale"].value == pytest.approx(64**-0.5)
        weights = [v for v in node.inputs[2:] if v is not None]
        assert weights and all(v.const_value is not None for v in weights)  # initializers
    # cls attention out of the blocks a cls-attention stage follows (blocks 0 and 2), for evit and cls-mass only
    with_cls = [i for i, n in enumerate(blocks) if len(n.outputs) > 1 and n.outputs[1].uses()]
    assert with_cls == ([] if spec.policy == "topk-l2" else [0, 2])


def test_default_engine_unchanged(small_vit) -> None:
    spec, _ = SPECS["topk-l2"]
    ops = _ops(build_model(small_vit, spec))
    assert not ops["com.raggedvit::RaggedViTBlock"] and ops["com.raggedvit::RaggedAttention"] == DEPTH


def test_cpu_ep_matches_pruned_vit(deit_tiny, images, ort_session) -> None:
    """deit_tiny (12 blocks), fp32: the session's logits within 1e-5 of PrunedViT's largest logit, same counts."""
    spec = PruneSpec.from_strings("cls-mass", "3,6,9", 0.5, 0.9, False)
    sess = ort_session(to_proto(build_model(deit_tiny, spec, capacity=True, engine="block")))
    logits, counts = sess.run(None, {"images": images.numpy()})[:2]
    with torch.no_grad():
        ref = PrunedViT(deit_tiny, spec, capacity=True)(images)
    np.testing.assert_array_equal(counts, ref.token_counts.numpy())
    assert np.abs(logits - ref.logits.numpy()).max() <= 1e-5 * float(ref.logits.abs().max())


# (model, policy, prune_at, fuse, capacity, dtype): with SPECS and the tests above on deit_tiny, every policy runs on
# each of the three block shapes the engine targets (C, H = 192, 3 / 384, 6 / 768, 12)
VALIDATED = [
    ("deit_tiny_patch16_224", "none", "", False, False, "fp32"),
    ("deit_small_patch16_224", "evit", "1", False, False, "fp16"),
    ("deit_small_patch16_224", "cls-mass", "1", False, True, "fp32"),
    ("deit_base_patch16_224", "evit", "1", True, False, "fp32"),
    ("deit_base_patch16_224", "topk-l2", "1", False, True, "fp16-all"),
]


@pytest.mark.parametrize(("name", "policy", "at", "fuse", "capacity", "dtype"), VALIDATED)
def test_validate_passes_on_the_cpu_ep(tmp_path, name, policy, at, fuse, capacity, dtype) -> None:
    """The export of a 3-block model of the named shape validates (raggedvit.validators.validate, CPU EP) with
    every block one RaggedViTBlock node of the model's head count."""
    from raggedvit.exporter import export_onnx
    from raggedvit.validators import load_recipe, validate

    vit, _ = load_vit(name, seed=0, img_size=64, sharpen_qk=4.0, model_kwargs={"depth": 3})
    spec = PruneSpec(policy, (int(at),) if at else (), 0.5, 0.9, fuse)
    path = export_onnx(vit, spec, tmp_path / "m.onnx", dtype=dtype, capacity=capacity, engine="block")
    blocks = [n for n in ir.load(path).graph if n.op_type == "RaggedViTBlock"]
    assert [n.attributes["num_heads"].value for n in blocks] == [vit.blocks[0].attn.num_heads] * 3
    images = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    report = validate(path, images, [f"r{i}" for i in range(4)], vit=vit, spec=spec, recipe=load_recipe(path))
    assert report.passed, report.to_markdown()


def _cli(*args: str) -> CliResult:
    return run_cli(*args)  # in this process (click's runner): the same command, no Python start


def test_cli_export_engine_block_validates(tmp_path) -> None:
    out = tmp_path / "block.onnx"
    args = ("--seed", "0", "--policy", "topk-l2", "--prune-at", "4", "--dtype", "fp16", "--engine", "block")
    res = _cli("export", "deit_tiny_patch16_224", *args, "-o", str(out))
    assert res.returncode == 0, res.stderr
    assert _ops(ir.load(out))["com.raggedvit::RaggedViTBlock"] == 12
    res = _cli("validate", str(out), "--random", "2")
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith("## raggedvit validation: PASS")
