"""The fp16 graph's own arithmetic, evaluated with onnx.reference (RaggedAttention / BiasGelu in Python).

The reference evaluator checks the graph arithmetic without the op library; ORT CPU runs the fp16 export too.
"""

from __future__ import annotations

import pytest

from raggedvit.exporter import build_model
from raggedvit.pruning import PruneSpec
from raggedvit.weights import load_vit

from ._pruned import diff_to_pruned
from .refeval import reference_evaluator


def test_fp16_graph_close_to_fp32_reference(images):
    vit, _ = load_vit("deit_tiny_patch16_224", seed=0, model_kwargs={"depth": 4})
    spec = PruneSpec("evit", (2,), fuse=True)
    model = build_model(vit, spec, dtype="fp16")
    x = images[:2]
    logits, counts = reference_evaluator(model).run(None, {"images": x.numpy()})
    diff, scale = diff_to_pruned(logits, counts, vit, spec, x)
    assert diff < 2e-2 * scale


def _elem_types(model):
    """name -> ONNX elem type of every tensor (after shape inference)."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    types = {vi.name: vi.type.tensor_type.elem_type for vi in [*g.value_info, *g.input, *g.output]}
    types.update({t.name: t.data_type for t in g.initializer})
    return types


def test_fp16_recipe_structure(deit_tiny):
    """fp16 export: residual Adds, LayerNorms of the stream and the head are float32; block GEMMs fp16."""
    from onnx import TensorProto

    vit, _ = load_vit("deit_tiny_patch16_224", seed=0, model_kwargs={"depth": 3})
    model = build_model(vit, PruneSpec("topk-l2", (1,), keep=0.5), dtype="fp16")
    types = _elem_types(model)
    nodes = {n.name: n for n in model.graph.node}
    by_hint = {o: n for n in model.graph.node for o in n.output if o}
    f32, f16 = TensorProto.FLOAT, TensorProto.FLOAT16
    for i in range(3):
        # res1 + norm2 are one com.microsoft::SkipLayerNormalization (onnx shape inference does not type its
        # outputs): all of its inputs are float32
        skip_ln = by_hint[f"blocks.{i}.res1"]
        assert skip_ln.op_type == "SkipLayerNormalization" and by_hint[f"blocks.{i}.norm2"] is skip_ln
        # (the residual input is untyped after a prune stage or an earlier contrib op; the others are known)
        assert all(types.get(t, f32) == f32 for t in skip_ln.input), [types.get(t) for t in skip_ln.input]
        assert all(types[t] == f32 for t in skip_ln.input[2:]) and types[skip_ln.input[0]] == f32
        res2 = by_hint[f"blocks.{i}.res2"]
        if i == 1:  # fc2 bias + res2 + block 2's norm1: one float32 SkipLayerNormalization
            assert res2.op_type == "SkipLayerNormalization" and by_hint["blocks.2.norm1"] is res2
            assert res2.input[1] == "blocks.1.res1" and all(types.get(t, f32) == f32 for t in res2.input)
            assert types["blocks.1.mlp.fc2.bias"] == f32
        else:  # before the prune stage (block 1) and before the head: Add(res1, fc2 cast to float32)
            assert res2.op_type == "Add" and res2.input[0] == f"blocks.{i}.res1" and types[res2.input[1]] == f32
        norm1 = by_hint[f"blocks.{i}.norm1"]
        assert types.get(f"blocks.{i}.norm1", f32) == f32
        assert norm1.op_type == ("SkipLayerNormalization" if i == 2 else "LayerNormalization")
        for ln in (f"blocks.{i}.norm1", f"blocks.{i}.norm2"):
            assert types[f"{ln}.weight"] == f32, ln
        for mm in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2"):
            assert types[f"blocks.{i}.{mm}.weight_t"] == f16, mm
            if mm in ("attn.qkv", "mlp.fc1"):  # onnx shape inference stops at custom / contrib ops
                assert types[f"blocks.{i}.{mm}.mm"] == f16, mm
    # (ONNX type constraints tie a node's data input to its float32 weights where inference stops at contrib ops)
    assert types.get("norm", f32) == f32 and types["norm.weight"] == f32
    assert types["head.weight_t"] == f32 and types.get("head", f32) == f32
    assert types["patch_embed.proj.mm"] == f32
    casts = [n for n in nodes.values() if n.op_type == "Cast" and n.name.startswith("n_blocks.")]
    assert len(casts) == 4 * 3  # per block: norm1/norm2 -> fp16, proj/fc2 -> fp32


def test_fp16_export_on_ort_cpu(ort_session, images):
    """The fp16 export runs on ORT's CPU EP; logits within the recipe's fp16 GEMM rounding of fp32 PyTorch."""
    vit, _ = load_vit("deit_tiny_patch16_224", seed=0, model_kwargs={"depth": 4})
    spec = PruneSpec("topk-l2", (2,), keep=0.5)
    x = images[:3]
    logits, counts = ort_session(build_model(vit, spec, dtype="fp16")).run(None, {"images": x.numpy()})
    diff, scale = diff_to_pruned(logits, counts, vit, spec, x)
    assert diff < 3e-3 * max(scale, 1.0)


@pytest.mark.parametrize(
    "spec",
    [PruneSpec("topk-l2", (2,), keep=0.5), PruneSpec("cls-mass", (1, 3)), PruneSpec("evit", (2,), fuse=True)],
    ids=["topk-l2", "cls-mass", "evit-fuse"],
)
def test_fp16_all_recipe_on_ort_cpu(ort_session, images, spec):
    """fp16-all: float16 residual stream and LayerNorms, no Cast inside the blocks; close to the fp32 model."""
    import onnx

    vit, _ = load_vit("deit_tiny_patch16_224", seed=0, model_kwargs={"depth": 4})
    model = build_model(vit, spec, dtype="fp16-all")
    onnx.checker.check_model(model, full_check=True)
    assert not [n.name for n in model.graph.node if n.op_type == "Cast" and n.name.startswith("n_blocks.")]
    f16 = {t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT16}
    assert {"blocks.0.norm1.weight", "blocks.0.norm2.weight", "blocks.1.norm1.weight"} <= f16
    assert "head.weight_t" not in f16 and "patch_embed.proj.weight_t" not in f16
    x = images[:3]
    logits, counts = ort_session(model).run(None, {"images": x.numpy()})
    diff, scale = diff_to_pruned(logits, counts, vit, spec, x)
    assert diff < 2e-2 * scale
