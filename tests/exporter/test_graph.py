"""Structure of the exported graph: IR version, opsets, RaggedAttention per block, checker, metadata."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from torch import nn

from raggedvit.exporter import UnsupportedModelError, build_model, check_graph, export_onnx, read_recipe
from raggedvit.pruning import PruneSpec


@pytest.mark.parametrize(
    "spec",
    [PruneSpec(), PruneSpec("topk-l2", (3, 6, 9)), PruneSpec("cls-mass", (4,)), PruneSpec("evit", (3, 6), fuse=True)],
    ids=lambda s: f"{s.policy}-{len(s.prune_at)}",
)
def test_graph_structure(deit_tiny, spec):
    recipe = {"model": "deit_tiny_patch16_224", "weights": {"source": "seeded", "seed": 0}}
    model = build_model(deit_tiny, spec, recipe=recipe)
    onnx.checker.check_model(model, full_check=True)
    assert check_graph(model) == []
    assert model.ir_version == 10
    opsets = {o.domain: o.version for o in model.opset_import}
    assert opsets[""] == 17 and opsets["com.raggedvit"] == 1
    attn = [n for n in model.graph.node if n.op_type == "RaggedAttention"]
    assert len(attn) == len(deit_tiny.blocks) == 12
    # the qkv bias is the op's third input (no Add after the qkv MatMul)
    assert all(len(a.input) == 3 and a.input[2].endswith(".attn.qkv.bias") for a in attn)
    producers = {o: n for n in model.graph.node for o in n.output}
    assert all(producers[a.input[0]].op_type == "MatMul" for a in attn)
    heads = {a.name: helper.get_attribute_value(a) for a in attn[0].attribute}
    assert heads["num_heads"] == 3 and heads["max_seqlen"] == 197
    assert heads["scale"] == pytest.approx(deit_tiny.blocks[0].attn.scale)
    # cls_attn is requested exactly from the blocks before a stage of evit / cls-mass
    with_cls = [i for i, a in enumerate(attn) if len(a.output) == 2 and a.output[1]]
    assert with_cls == ([i - 1 for i in spec.prune_at] if spec.needs_cls_attn else [])
    ops = {n.op_type for n in model.graph.node}
    if spec.policy in ("cls-mass",) or spec.fuse:  # data-dependent counts: the general stage
        assert {"TopK", "NonZero", "CumSum", "ScatterElements"} <= ops
        # one host synchronisation (NonZero) per stage; evit fuse needs one more for its row coordinates
        nonzero = sum(n.op_type == "NonZero" for n in model.graph.node)
        assert nonzero == len(spec.prune_at) * (2 if spec.fuse else 1)
        assert spec.fuse or "ScatterND" not in ops
    elif spec.policy != "none":  # export-time counts: the uniform stage, static shapes (CUDA-graph capturable)
        assert "TopK" in ops and not ops & {"NonZero", "ScatterND", "ScatterElements"}
    assert not ops & {"Loop", "If", "Scan", "Range", "Size"}
    assert sum(n.op_type == "Shape" for n in model.graph.node) == 1
    out = {o.name: o for o in model.graph.output}
    dims = [d.dim_param or d.dim_value for d in out["token_counts"].type.tensor_type.shape.dim]
    assert dims == ["batch", len(spec.prune_at)]
    r = read_recipe(model)
    assert PruneSpec.from_dict(r["prune"]) == spec
    assert r["model"] == "deit_tiny_patch16_224" and r["weights"]["seed"] == 0
    assert (r["num_prefix_tokens"], r["tokens_per_image"], r["img_size"], r["dtype"]) == (1, 197, 224, "fp32")


def test_fp16_graph_stores_fp16_weights(deit_tiny):
    model = build_model(deit_tiny, PruneSpec("evit", (4,), fuse=True), dtype="fp16")
    assert check_graph(model) == []
    floats = [t for t in model.graph.initializer if t.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16)]
    big = [t for t in floats if np.prod(t.dims) > 1000]
    gemm = [t for t in big if t.name.startswith("blocks.")]  # the block GEMMs: fp16
    assert gemm and all(t.data_type == TensorProto.FLOAT16 for t in gemm)
    assert all(t.data_type == TensorProto.FLOAT for t in big if t not in gemm)  # embedding, head: fp32
    assert model.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT


def test_check_graph_reports_problems(deit_tiny):
    model = build_model(deit_tiny, PruneSpec("topk-l2", (4,)))
    model.ir_version = 14
    model.graph.node.append(helper.make_node("Size", ["images"], ["size_out"]))
    model.graph.node.remove(next(n for n in model.graph.node if n.op_type == "RaggedAttention"))
    problems = check_graph(model)
    assert any("IR version 14" in p for p in problems)
    assert any("Size" in p for p in problems)
    assert any("11 RaggedAttention nodes" in p for p in problems)


def test_export_writes_atomically(deit_tiny, tmp_path):
    path = export_onnx(deit_tiny, PruneSpec("cls-mass", (4,)), tmp_path / "m.onnx", recipe={"model": "x"})
    assert read_recipe(path)["prune"]["policy"] == "cls-mass"
    assert [p.name for p in tmp_path.iterdir()] == ["m.onnx"]


def test_unsupported_model_is_rejected(deit_tiny):
    vit = copy.deepcopy(deit_tiny)
    vit.blocks[2].mlp.act = nn.ReLU()
    with pytest.raises(UnsupportedModelError, match="block 2: activation"):
        build_model(vit, PruneSpec())


def test_prune_index_out_of_range(deit_tiny):
    with pytest.raises(ValueError, match="1..11"):
        build_model(deit_tiny, PruneSpec("topk-l2", (12,)))
