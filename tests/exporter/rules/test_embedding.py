"""The patch embedding rules (raggedvit/exporter/rules/embedding.py) on hand-built graphs."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from raggedvit.exporter.rules import fuse_for_ort

from ._graphs import const as _const
from ._graphs import run as _run


def _embedding_model(p: int, rows: int, C: int, axis: int = 1) -> ir.Model:
    """Add(Concat(prefix [B, p, C], Add(y [B, rows, C], b [C])), pos [1, p + rows, C]): timm ViT's embedding."""
    gen = np.random.default_rng(0)
    f32 = ir.TensorType(ir.DataType.FLOAT)
    prefix = ir.Value(name="prefix", shape=ir.Shape(["B", p, C]), type=f32)
    y = ir.Value(name="y", shape=ir.Shape(["B", rows, C]), type=f32)
    b = _const("b", gen.standard_normal(C).astype(np.float32))
    pos = _const("pos", gen.standard_normal((1, p + rows, C)).astype(np.float32))
    add = ir.node("Add", [y, b])
    cat = ir.node("Concat", [prefix, add.outputs[0]], {"axis": axis})
    out = ir.node("Add", [cat.outputs[0], pos])
    out.outputs[0].name = "tokens"
    graph = ir.Graph(
        [prefix, y], [out.outputs[0]], nodes=[add, cat, out], initializers=[b, pos], opset_imports={"": 20}
    )
    return ir.Model(graph, ir_version=10)


def test_patch_bias_joins_the_position_table():
    from onnxscript.rewriter import rewrite

    from raggedvit.exporter.rules.embedding import PatchBiasIntoPosition

    gen = np.random.default_rng(1)
    feeds = {"prefix": gen.standard_normal((2, 1, 8)).astype(np.float32)}
    feeds["y"] = gen.standard_normal((2, 6, 8)).astype(np.float32)
    want = _run(_embedding_model(1, 6, 8), feeds)
    model = rewrite(
        _embedding_model(1, 6, 8), pattern_rewrite_rules=[PatchBiasIntoPosition.rule("patch_bias_into_position")]
    )
    assert [n.op_type for n in model.graph] == ["Concat", "Add"]  # no bias Add left
    np.testing.assert_allclose(_run(model, feeds), want, rtol=1e-6, atol=1e-6)


def test_patch_bias_rule_needs_a_row_concat():
    from onnxscript.rewriter import rewrite

    from raggedvit.exporter.rules.embedding import PatchBiasIntoPosition

    model = rewrite(
        _embedding_model(1, 6, 8, axis=2),
        pattern_rewrite_rules=[PatchBiasIntoPosition.rule("patch_bias_into_position")],
    )
    assert [n.op_type for n in model.graph] == ["Add", "Concat", "Add"]


def _patch_embed_model(
    N: int = 32, prefix: int = 1, *, cast: bool = True, perm: tuple[int, ...] = (0, 2, 4, 1, 3, 5)
) -> ir.Model:
    """timm ViT's embedding as torch.onnx writes it for fp16-all: Cast(Add(Concat(Expand(cls)..., MatMul(Reshape(
    Transpose(Reshape(images [2, 3, 16, 24]))), W [48, N])), pos [1, P + 6, N]), float16); patch 4."""
    gen = np.random.default_rng(4)
    B, C, H, W, p = 2, 3, 16, 24, 4
    gh, gw, K = H // p, W // p, C * p * p
    f32 = ir.TensorType(ir.DataType.FLOAT)
    images = ir.Value(name="images", shape=ir.Shape([B, C, H, W]), type=f32)
    grid = ir.node("Reshape", [images, _const("grid", np.array([-1, C, gh, p, gw, p], np.int64))], {"allowzero": 1})
    grid.outputs[0].shape, grid.outputs[0].type = ir.Shape([B, C, gh, p, gw, p]), f32
    tr = ir.node("Transpose", [grid.outputs[0]], {"perm": list(perm)})
    tr.outputs[0].shape, tr.outputs[0].type = ir.Shape([B, gh, gw, C, p, p]), f32
    flat = ir.node("Reshape", [tr.outputs[0], _const("flat", np.array([-1, gh * gw, K], np.int64))], {"allowzero": 1})
    flat.outputs[0].shape, flat.outputs[0].type = ir.Shape([B, gh * gw, K]), f32
    mm = ir.node("MatMul", [flat.outputs[0], _const("w", (gen.standard_normal((K, N)) / 7).astype(np.float32))])
    mm.outputs[0].shape, mm.outputs[0].type = ir.Shape([B, gh * gw, N]), f32
    nodes = [grid, tr, flat, mm]
    parts = []
    for j in range(prefix):
        ex = ir.node("Expand", [_const(f"tok{j}", gen.standard_normal((1, 1, N)).astype(np.float32)),
                                _const(f"shape{j}", np.array([B, 1, 1], np.int64))])  # fmt: skip
        ex.outputs[0].shape, ex.outputs[0].type = ir.Shape([B, 1, N]), f32
        nodes.append(ex)
        parts.append(ex.outputs[0])
    cat = ir.node("Concat", [*parts, mm.outputs[0]], {"axis": 1})
    pos = _const("pos", gen.standard_normal((1, prefix + gh * gw, N)).astype(np.float32))
    add = ir.node("Add", [cat.outputs[0], pos])
    add.outputs[0].shape, add.outputs[0].type = ir.Shape([B, prefix + gh * gw, N]), f32
    nodes += [cat, add]
    out = add
    if cast:
        out = ir.node("Cast", [add.outputs[0]], {"to": ir.DataType.FLOAT16})
        out.outputs[0].shape, out.outputs[0].type = add.outputs[0].shape, ir.TensorType(ir.DataType.FLOAT16)
        nodes.append(out)
    out.outputs[0].name = "tokens"
    inits = [v for n in nodes for v in n.inputs if v is not None and v.const_value is not None]
    graph = ir.Graph([images], [out.outputs[0]], nodes=nodes, initializers=inits, opset_imports={"": 20})
    return ir.Model(graph, ir_version=10)


@pytest.mark.parametrize(
    ("kwargs", "fused"),
    [
        ({}, True),
        ({"prefix": 2}, True),  # class + distillation tokens
        ({"prefix": 0}, True),  # no prefix rows (Concat of the patch rows alone)
        ({"cast": False}, False),  # float32 stream (the fp16 recipe): the embedding stays float32
        ({"N": 40}, False),  # width not a multiple of 16: no CUDA kernel of ours
        ({"perm": (0, 2, 4, 1, 5, 3)}, False),  # not the im2col of a conv
    ],
    ids=["cls", "cls_dist", "no_prefix", "float32_stream", "n40", "other_perm"],
)
def test_patch_embed_rule(ort_session, kwargs, fused):
    feeds = {"images": np.random.default_rng(5).standard_normal((2, 3, 16, 24)).astype(np.float32)}
    (want,) = ort_session(_patch_embed_model(**kwargs)).run(None, feeds)
    model = fuse_for_ort(_patch_embed_model(**kwargs))
    ops = [n.op_type for n in model.graph]
    assert (ops == ["PatchEmbed"]) == fused, ops
    if fused:
        node = model.graph.node(0)
        assert node.domain == "com.raggedvit" and node.attributes["patch"].as_int() == 4
        assert node.inputs[1].const_value.dtype == ir.DataType.FLOAT16
    (got,) = ort_session(model).run(None, feeds)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=4e-3, atol=4e-3)
