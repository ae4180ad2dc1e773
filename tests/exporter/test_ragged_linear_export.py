"""Exports with ragged_linear=True: every block GEMM is a com.raggedvit::RaggedLinear node (no MatMul left for
them), the recipe records it, the exporter refuses fp32 and misaligned GEMMs; the ORT CPU EP run equals PrunedViT
once the op library registers RaggedLinear (skipped before)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from timm.models.eva import Eva

from raggedvit.exporter import build_model, check_graph, read_recipe
from raggedvit.exporter.ragged_linear import check_ragged_linear
from raggedvit.pruning import PrunedViT, PruneSpec
from raggedvit.weights import load_vit

from .conftest import to_proto

SPEC = PruneSpec("cls-mass", (1,), mass=0.8)
DEPTH = 2


@pytest.fixture(scope="module")
def deit_tiny_d2():
    from raggedvit.weights import perturb_biases_and_norms_

    vit, _ = load_vit("deit_tiny_patch16_224", seed=1, model_kwargs={"depth": DEPTH})
    return perturb_biases_and_norms_(vit)


@pytest.fixture(scope="module", params=["fp16", "fp16-all"])
def ragged_export(request, deit_tiny_d2):
    dtype = request.param
    model = to_proto(build_model(deit_tiny_d2, SPEC, dtype=dtype, capacity=True, ragged_linear=True))
    return dtype, model


def test_block_gemms_are_ragged_linear(ragged_export):
    dtype, model = ragged_export
    assert check_graph(model) == []
    nodes = [n for n in model.graph.node if n.op_type == "RaggedLinear"]
    assert len(nodes) == 4 * DEPTH and all(n.domain == "com.raggedvit" for n in nodes)
    ops = Counter(n.op_type for n in model.graph.node)
    embed = int(dtype == "fp16-all")  # fp16-all: the patch embedding is com.raggedvit::PatchEmbed
    assert (ops["PatchEmbed"], ops["MatMul"] + ops["Gemm"]) == (embed, 2 - embed)  # + the head
    for i in range(DEPTH):
        qkv, proj, fc1, fc2 = nodes[4 * i : 4 * i + 4]
        assert [n.input[1].split(".")[-2] for n in (qkv, proj, fc1, fc2)] == ["qkv", "proj", "fc1", "fc2"]
        assert len(qkv.input) == 5 and qkv.input[2] == "" and qkv.input[3] == ""  # qkv bias: in RaggedAttention
        assert [a.i for n in (qkv, proj, fc1, fc2) for a in n.attribute if a.name == "activation"] == [0, 0, 1, 0]
        fused = dtype == "fp16-all"  # fp16: float32 stream, the residual add stays outside
        for n in (proj, fc2):  # fused: in the epilogue, or moved into the norm that reads it (its Skip input)
            readers = [c for c in model.graph.node if c.input and c.input[0] == n.output[0]]
            norms = [c for c in readers if c.op_type == "SkipLayerNormalization"
                     or c.op_type == "GatherLayerNorm" and len(c.input) > 4]  # fmt: skip
            assert (n.input[3] != "" or bool(norms)) == fused
            assert not (n.input[3] != "" and norms)
            # (a stage's GatherLayerNorm of the gathered rows has 4 inputs.) fp16-all rows: com.raggedvit::
            # GatherLayerNorm with the GEMM's live count (dead rows neither read nor written), not ONNX Runtime's
            # SkipLayerNormalization over every row
            for c in norms:
                assert c.op_type == "GatherLayerNorm" and len(c.input) == 7 and c.input[6] == n.input[4]
                assert c.input[4] != "" and c.input[5] == ""  # Skip = the residual, no Bias
        assert all(n.input[4] != "" for n in (qkv, proj, fc1, fc2))  # the live count
    assert read_recipe(model)["ragged_linear"] is True


@pytest.mark.parametrize(
    ("spec", "nodes"),
    [(SPEC, 4 * (DEPTH - 1)), (PruneSpec("topk-l2", (1,), keep=0.5), 0)],
    ids=["cls-mass", "topk-l2"],
)
def test_dead_rows_export(deit_tiny_d2, spec, nodes):
    """--ragged-linear-blocks dead-rows: RaggedLinear in the blocks after a cls-mass stage only (none for a count
    policy, whose capacities are exact), MatMul elsewhere; check_graph accepts both."""
    model = to_proto(build_model(deit_tiny_d2, spec, dtype="fp16-all", capacity=True, ragged_linear="dead-rows"))
    assert check_graph(model) == []
    ops = Counter(n.op_type for n in model.graph.node)
    assert ops["RaggedLinear"] == nodes
    assert ops["PatchEmbed"] == 1  # the patch embedding (fp16-all)
    assert ops["MatMul"] + ops["Gemm"] == 1 + 4 * DEPTH - nodes  # the head, the other block GEMMs
    assert read_recipe(model)["ragged_linear"] == "dead-rows"


def test_default_export_has_no_ragged_linear(deit_tiny_d2):
    model = to_proto(build_model(deit_tiny_d2, SPEC, dtype="fp16", capacity=True))
    assert not any(n.op_type == "RaggedLinear" for n in model.graph.node)
    assert "ragged_linear" not in read_recipe(model)  # default recipes are unchanged


def test_refusals(deit_tiny_d2):
    with pytest.raises(ValueError, match="ragged linear needs an fp16 / fp16-all export"):
        build_model(deit_tiny_d2, SPEC, ragged_linear=True)
    vit, _ = load_vit("deit_tiny_patch16_224", seed=0, model_kwargs={"depth": 1, "mlp_ratio": 3.9})  # fc1 N = 748
    with pytest.raises(ValueError, match=r"blocks\.0\.mlp\.fc1 has weight \[N=748, K=192\]"):
        check_ragged_linear(vit, "fp16")
    eva = Eva(img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=4, num_classes=10)
    with pytest.raises(ValueError, match="ragged linear needs a timm VisionTransformer, got Eva"):
        check_ragged_linear(eva, "fp16")


def _session_or_skip(ort_session, model):
    try:
        return ort_session(model)
    except Exception as e:  # noqa: BLE001  (onnxruntime raises its own Fail / InvalidGraph types)
        text = str(e)
        if "RaggedLinear" in text or "not a registered function" in text:
            pytest.skip(f"the loaded op library does not register com.raggedvit::RaggedLinear yet: {text[:200]}")
        raise


def test_ort_cpu_equals_pruned_vit(ragged_export, deit_tiny_d2, images, ort_session):
    dtype, model = ragged_export
    session = _session_or_skip(ort_session, model)
    from raggedvit.pruning.precision import apply_dtype

    x = images[:3]
    got = session.run(None, {"images": x.numpy()})
    with torch.no_grad():
        ref = PrunedViT(apply_dtype(deit_tiny_d2, dtype), SPEC, capacity=True)(x)
    np.testing.assert_array_equal(got[1], ref.token_counts.numpy())
    scale = float(ref.logits.abs().max())
    assert float(np.abs(got[0] - ref.logits.numpy()).max()) <= 2e-2 * scale
