"""Structure of the traced graph: opsets, fusions per block, RaggedAttention, stages, outputs, metadata, files."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from raggedvit.exporter import build_model, check_graph, export_onnx, read_recipe, saving
from raggedvit.exporter.naming import output_names
from raggedvit.pruning import PrunedViT, PruneSpec
from raggedvit.pruning.packed import kept_token_index
from raggedvit.weights import load_vit

from .conftest import to_proto

SPECS = [PruneSpec(), PruneSpec("topk-l2", (2, 4)), PruneSpec("cls-mass", (3,)), PruneSpec("evit", (2, 4), fuse=True)]


def _ops(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in model.graph.node)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.policy}-{len(s.prune_at)}{'-fuse' if s.fuse else ''}")
def test_graph_structure(deit_tiny_d6, spec):
    recipe = {"model": "deit_tiny_patch16_224", "weights": {"source": "seeded", "seed": 1}}
    model = to_proto(build_model(deit_tiny_d6, spec, recipe=recipe))
    onnx.checker.check_model(model, full_check=True)
    assert check_graph(model) == []
    assert model.ir_version == 10 and model.producer_name == "raggedvit"
    opsets = {o.domain: o.version for o in model.opset_import}
    assert opsets[""] == 20 and opsets["com.raggedvit"] == 1
    ops = _ops(model)
    depth = len(deit_tiny_d6.blocks)
    attn = [n for n in model.graph.node if n.op_type == "RaggedAttention"]
    assert len(attn) == depth
    # the qkv bias is the op's third input: no Add between the bias-free qkv GEMM and the op
    producers = {o: n for n in model.graph.node for o in n.output}
    assert all(len(a.input) == 3 and producers[a.input[0]].op_type == "MatMul" for a in attn)
    assert all(len(producers[a.input[0]].input) == 2 for a in attn)
    attrs = {a.name: helper.get_attribute_value(a) for a in attn[0].attribute}
    assert attrs["num_heads"] == 3 and attrs["scale"] == pytest.approx(deit_tiny_d6.blocks[0].attn.scale)
    # cls_attn is requested exactly from the blocks that rank a stage: the block before it (cls-mass), its own (evit)
    with_cls = [i for i, a in enumerate(attn) if len(a.output) == 2 and a.output[1]]
    shift = 0 if spec.descriptor.where == "inside" else 1
    assert with_cls == ([i - shift for i in spec.prune_at] if spec.needs_cls_attn else [])
    # the fusions: one BiasGelu per block; proj + res1 + norm2 always, fc2 + res2 + the next norm1 unless a stage
    # (which gathers rows first) or the head follows
    assert ops["BiasGelu"] == depth and "Gelu" not in ops
    assert ops["SkipLayerNormalization"] == depth + (depth - 1 - len(spec.prune_at))
    if spec.static_shapes:  # export-time counts: static shapes at a given batch, CUDA-graph capturable
        assert "NonZero" not in ops and (spec.policy == "none" or ops["RaggedSelect"] == len(spec.prune_at))
    else:  # one host synchronisation (NonZero) per stage
        assert ops["NonZero"] == len(spec.prune_at)
    assert not set(ops) & {"Loop", "If", "Scan", "ScatterND"} or spec.fuse
    out = {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim] for o in model.graph.output}
    assert out == {"logits": ["batch", 1000], "token_counts": ["batch", len(spec.prune_at)]}
    r = read_recipe(model)
    assert PruneSpec.from_dict(r["prune"]) == spec and r["outputs"] == ["logits", "token_counts"]
    assert r["model"] == "deit_tiny_patch16_224" and r["weights"]["seed"] == 1
    assert (r["num_prefix_tokens"], r["tokens_per_image"], r["img_size"], r["dtype"]) == (1, 197, 224, "fp32")


def test_diagnostics_outputs(deit_tiny_d6, images, ort_session):
    spec = PruneSpec("cls-mass", (2, 4), mass=0.8)
    model = build_model(deit_tiny_d6, spec, diagnostics=True)
    names = ["logits", "token_counts", "token_index_0", "cu_seqlens_0", "token_index_1", "cu_seqlens_1"]
    assert [o.name for o in to_proto(model).graph.output] == names
    x = images[:3]
    got = ort_session(model).run(None, {"images": x.numpy()})
    with torch.no_grad():
        ref = PrunedViT(deit_tiny_d6, spec)(x)
    for s in range(2):
        np.testing.assert_array_equal(got[2 + 2 * s], ref.token_index[s].numpy())
        np.testing.assert_array_equal(got[3 + 2 * s], ref.cu_seqlens[s].numpy())


@pytest.mark.parametrize("diagnostics", [False, True], ids=["plain", "diagnostics"])
@pytest.mark.parametrize("capacity", [False, True], ids=["compact", "capacity"])
def test_stage_outputs_name_the_kept_tokens(deit_tiny_d6, images, ort_session, diagnostics, capacity):
    """Every export names each stage's src and cu_seqlens (recipe "stage_outputs", not graph outputs): marked in a
    copy, they give the reference's kept tokens (kept_token_index), with or without diagnostic outputs."""
    spec = PruneSpec("evit", (2, 4), keep=0.5, fuse=True)
    model = to_proto(build_model(deit_tiny_d6, spec, diagnostics=diagnostics, capacity=capacity))
    pairs = read_recipe(model)["stage_outputs"]
    cu_names = ["cu_seqlens_0", "cu_seqlens_1"] if diagnostics else [f"raggedvit_stage_{s}_cu_seqlens" for s in (0, 1)]
    assert pairs == [[f"raggedvit_stage_{s}_src", cu] for s, cu in enumerate(cu_names)]
    graph_outputs = [o.name for o in model.graph.output]
    assert graph_outputs == output_names(deit_tiny_d6, spec, diagnostics=diagnostics)
    for src, _ in pairs:
        model.graph.output.append(onnx.ValueInfoProto(name=src))
    for cu in cu_names if not diagnostics else []:
        model.graph.output.append(onnx.ValueInfoProto(name=cu))
    x = images[:3]
    got = dict(zip([o.name for o in model.graph.output], ort_session(model).run(None, {"images": x.numpy()})))
    with torch.no_grad():
        ref = PrunedViT(deit_tiny_d6, spec)(x)
    srcs = [torch.from_numpy(got[src]) for src, _ in pairs]
    for s, index in enumerate(kept_token_index(srcs, 3, 197, fuse=True)):
        cu = got[pairs[s][1]]
        np.testing.assert_array_equal(cu, ref.cu_seqlens[s].numpy())
        np.testing.assert_array_equal(index[: int(cu[-1])].numpy(), ref.token_index[s].numpy())


def test_headless_model_outputs_features(images, ort_session):
    vit, _ = load_vit("vit_small_patch16_224", seed=0, model_kwargs={"depth": 2, "num_classes": 0})
    spec = PruneSpec("topk-l2", (1,))
    model = build_model(vit, spec)
    assert [o.name for o in to_proto(model).graph.output] == ["features", "token_counts"]
    feats, counts = ort_session(model).run(None, {"images": images[:2].numpy()})
    with torch.no_grad():
        ref = PrunedViT(vit, spec)(images[:2])
    assert feats.shape == (2, 384)
    np.testing.assert_allclose(feats, ref.logits.numpy(), atol=1e-4)


def test_fp16_graph_stores_fp16_block_weights(deit_tiny_d6):
    model = to_proto(build_model(deit_tiny_d6, PruneSpec("evit", (2,), fuse=True), dtype="fp16"))
    assert check_graph(model) == []
    big = {t.name: t.data_type for t in model.graph.initializer if np.prod(t.dims) > 10000}
    blocks = {k: v for k, v in big.items() if ".blocks." in k}
    assert blocks and set(blocks.values()) == {TensorProto.FLOAT16}  # the block GEMMs
    assert {v for k, v in big.items() if k not in blocks} == {TensorProto.FLOAT}  # embedding, head
    assert model.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT


def test_check_graph_reports_problems(deit_tiny_d6):
    model = to_proto(build_model(deit_tiny_d6, PruneSpec("topk-l2", (2,))))
    model.ir_version = 14
    model.graph.node.append(helper.make_node("Loop", ["images"], ["loop_out"]))
    model.graph.node.remove(next(n for n in model.graph.node if n.op_type == "RaggedAttention"))
    problems = check_graph(model)
    assert any("IR version 14" in p for p in problems)
    assert any("Loop" in p for p in problems)
    assert any("5 RaggedAttention nodes" in p for p in problems)


def test_export_writes_atomically(deit_tiny_d6, tmp_path, monkeypatch):
    path = export_onnx(deit_tiny_d6, PruneSpec("cls-mass", (4,)), tmp_path / "m.onnx", recipe={"model": "x"})
    assert read_recipe(path)["prune"]["policy"] == "cls-mass"
    assert [p.name for p in tmp_path.iterdir()] == ["m.onnx"]

    def broken(*args, **kwargs):
        raise onnx.checker.ValidationError("broken")

    monkeypatch.setattr(onnx.checker, "check_model", broken)
    with pytest.raises(onnx.checker.ValidationError):
        export_onnx(deit_tiny_d6, PruneSpec(), tmp_path / "n.onnx")
    assert [p.name for p in tmp_path.iterdir()] == ["m.onnx"]


def test_large_models_use_external_data(deit_tiny_d6, images, ort_session, tmp_path, monkeypatch):
    monkeypatch.setattr(saving, "EXTERNAL_DATA_BYTES", 1 << 20)
    spec = PruneSpec("topk-l2", (2,))
    path = export_onnx(deit_tiny_d6, spec, tmp_path / "m.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"]
    assert path.stat().st_size < 1 << 20
    logits, _ = ort_session(str(path)).run(None, {"images": images[:2].numpy()})
    with torch.no_grad():
        ref = PrunedViT(deit_tiny_d6, spec)(images[:2])
    np.testing.assert_allclose(logits, ref.logits.numpy(), atol=1e-4)


def test_unsupported_model_is_rejected(deit_tiny_d6):
    import copy

    from torch import nn

    vit = copy.deepcopy(deit_tiny_d6)
    vit.blocks[2] = nn.Identity()
    with pytest.raises(ValueError, match="block 2 is Identity"):
        build_model(vit, PruneSpec())


def test_prune_index_out_of_range(deit_tiny_d6):
    with pytest.raises(ValueError, match="1..5"):
        build_model(deit_tiny_d6, PruneSpec("topk-l2", (6,)))
