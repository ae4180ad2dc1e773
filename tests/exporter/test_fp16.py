"""The fp16 graph's own arithmetic, evaluated with onnx.reference (RaggedAttention / BiasGelu in Python).

The reference evaluator checks the graph arithmetic without the op library; ORT CPU runs the fp16 export too.
"""

from __future__ import annotations

from collections import Counter

import pytest

from raggedvit.exporter import build_model
from raggedvit.pruning import PruneSpec
from raggedvit.weights import load_vit, perturb_biases_and_norms_

from ._pruned import diff_to_pruned
from .conftest import to_proto
from .refeval import reference_evaluator


def test_fp16_graph_close_to_fp32_reference(images):
    vit, _ = load_vit("deit_tiny_patch16_224", seed=0, model_kwargs={"depth": 4})
    spec = PruneSpec("evit", (2,), fuse=True)
    model = to_proto(build_model(vit, spec, dtype="fp16"))
    x = images[:2]
    logits, counts = reference_evaluator(model).run(None, {"images": x.numpy()})
    diff, scale = diff_to_pruned(logits, counts, vit, spec, x)
    assert diff < 2e-2 * scale


def _initializer_types(model) -> dict[str, int]:
    return {t.name: t.data_type for t in model.graph.initializer}


def test_fp16_recipe_structure():
    """fp16 export: block GEMM weights fp16; every LayerNorm / SkipLayerNormalization weight, the embedding and
    the head float32; per block 4 Casts (norm1 / norm2 -> fp16, proj / fc2 -> fp32)."""
    from onnx import TensorProto

    vit, _ = load_vit("deit_tiny_patch16_224", seed=0, model_kwargs={"depth": 3})
    perturb_biases_and_norms_(vit)  # (timm's init leaves the biases at zero: the exporter drops zero biases)
    model = to_proto(build_model(vit, PruneSpec("topk-l2", (1,), keep=0.5), dtype="fp16"))
    types = _initializer_types(model)
    f32, f16 = TensorProto.FLOAT, TensorProto.FLOAT16
    gemms = [n for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in types]  # Linears
    # the patch embedding (its weight's reshape + transpose folded into one initializer), 4 per block, the head
    assert [types[g.input[1]] for g in gemms] == [f32] + [f16] * 12 + [f32]
    norms = [n for n in model.graph.node if n.op_type in ("LayerNormalization", "SkipLayerNormalization")]
    assert norms and all(types[n.input[2 if n.op_type == "SkipLayerNormalization" else 1]] == f32 for n in norms)
    skip = [n for n in model.graph.node if n.op_type == "SkipLayerNormalization"]
    assert skip and all(types[n.input[4]] == f32 for n in skip)  # the GEMM bias, added in float32
    casts = [n for n in model.graph.node if n.op_type == "Cast"]
    to = Counter(next(a.i for a in n.attribute if a.name == "to") for n in casts)
    assert to[f16] == 2 * 3 and to[f32] >= 2 * 3  # (+ the pruning score's cast to float32)


def test_fp16_export_on_ort_cpu(ort_session, images):
    """The fp16 export runs on ORT's CPU EP; logits within the recipe's fp16 GEMM rounding of fp32 PyTorch."""
    vit, _ = load_vit("deit_tiny_patch16_224", seed=0, model_kwargs={"depth": 4})
    spec = PruneSpec("topk-l2", (2,), keep=0.5)
    x = images[:3]
    logits, counts = ort_session(to_proto(build_model(vit, spec, dtype="fp16"))).run(None, {"images": x.numpy()})
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
    model = to_proto(build_model(vit, spec, dtype="fp16-all"))
    onnx.checker.check_model(model, full_check=True)
    f16 = onnx.TensorProto.FLOAT16
    casts = [n for n in model.graph.node if n.op_type == "Cast"]
    to_f16 = [n for n in casts if next(a.i for a in n.attribute if a.name == "to") == f16]
    assert len(to_f16) == spec.fuse * len(spec.prune_at)  # the fused tokens: the embedding is PatchEmbed's
    (embed,) = [n for n in model.graph.node if n.op_type == "PatchEmbed"]  # float32 image -> float16 stream
    types = _initializer_types(model)
    norms = [n for n in model.graph.node if n.op_type in ("LayerNormalization", "SkipLayerNormalization")]
    assert sum(types.get(n.input[1]) == f16 or types.get(n.input[2]) == f16 for n in norms) >= 4
    gemms = [n for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in types]
    assert types[embed.input[1]] == f16 and types[embed.input[3]] == onnx.TensorProto.FLOAT  # weight, positions
    assert types[gemms[-1].input[1]] == onnx.TensorProto.FLOAT  # the head
    x = images[:3]
    logits, counts = ort_session(model).run(None, {"images": x.numpy()})
    diff, scale = diff_to_pruned(logits, counts, vit, spec, x)
    assert diff < 2e-2 * scale
