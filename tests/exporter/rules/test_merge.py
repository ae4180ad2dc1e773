"""The token-merging pass (raggedvit/exporter/rules/merge.py: merge_residual) on hand-built graphs: a RaggedMerge
of Add(residual, Add(y, b)) takes the residual, y and b itself, and the result is the same bits (float32, CPU EP)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from onnx_ir.passes.common import RemoveUnusedNodesPass

from raggedvit.exporter.rules._common import RAGGED
from raggedvit.exporter.rules.merge import merge_residual

from ._graphs import const as _const

B, N, C, H, DH = 2, 9, 8, 2, 4  # two images of 9 rows, one prefix row
T, W = B * N, 3 * H * DH


def _model(
    *,
    bias: bool = True,
    bias_first: bool = False,
    branch_first: bool = False,
    sum_read: bool = False,
    branch_read: bool = False,
    cast: bool = False,
) -> ir.Model:
    """RaggedMerge(Add(x, Add(y, b)), qkv, -, -, cu) (outputs: x_out, size_out, cu_out, src, key_bias, score);
    bias: the Add(y, b) (else Add(x, y)); bias_first: Add(b, y); branch_first: Add(branch, x); sum_read /
    branch_read: the sum / the branch is also a graph output; cast: y is float16, the branch Cast to float."""
    f32 = ir.TensorType(ir.DataType.FLOAT)
    x = ir.Value(name="x", shape=ir.Shape([T, C]), type=f32)
    y = ir.Value(name="y", shape=ir.Shape([T, C]), type=ir.TensorType(ir.DataType.FLOAT16) if cast else f32)
    qkv = ir.Value(name="qkv", shape=ir.Shape([T, W]), type=f32)
    cu = ir.Value(name="cu", shape=ir.Shape([B + 1]), type=ir.TensorType(ir.DataType.INT64))
    npt = np.float16 if cast else np.float32
    b = _const("b", np.linspace(-0.3, 0.3, C).astype(npt))
    nodes, branch = [], y
    if bias:
        add_b = ir.node("Add", [b, y] if bias_first else [y, b])
        add_b.outputs[0].shape, add_b.outputs[0].type = y.shape, y.type
        nodes.append(add_b)
        branch = add_b.outputs[0]
    if cast:
        to = ir.node("Cast", [branch], {"to": ir.DataType.FLOAT})
        to.outputs[0].shape, to.outputs[0].type = x.shape, f32
        nodes.append(to)
        branch = to.outputs[0]
    if branch is not y:
        branch.name = "branch"
    add = ir.node("Add", [branch, x] if branch_first else [x, branch])
    add.outputs[0].name, add.outputs[0].shape, add.outputs[0].type = "sum", x.shape, f32
    attrs = {"num_heads": H, "num_prefix": 1, "r": 3, "class_token": 1}
    merge = ir.node("RaggedMerge", [add.outputs[0], qkv, None, None, cu], attrs, domain=RAGGED, num_outputs=6)
    types = (f32, f32, cu.type, cu.type, f32, f32)
    for value, name, t in zip(merge.outputs, ("x_out", "size_out", "cu_out", "src", "key_bias", "score"), types):
        value.name, value.type = name, t
    outputs = list(merge.outputs) + ([add.outputs[0]] if sum_read else []) + ([branch] if branch_read else [])
    graph = ir.Graph(
        [x, y, qkv, cu],
        outputs,
        nodes=[*nodes, add, merge],
        initializers=[b],
        opset_imports={"": 20, RAGGED: 1},
    )
    return ir.Model(graph, ir_version=10)


def _feeds(cast: bool = False) -> dict[str, np.ndarray]:
    gen = np.random.default_rng(5)
    return {
        "x": gen.standard_normal((T, C)).astype(np.float32),
        "y": gen.standard_normal((T, C)).astype(np.float16 if cast else np.float32),
        "qkv": gen.standard_normal((T, W)).astype(np.float32),
        "cu": np.arange(B + 1, dtype=np.int64) * N,
    }


def _merge_inputs(model: ir.Model) -> list[str]:
    node = next(n for n in model.graph if n.op_type == "RaggedMerge")
    return [v.name if v is not None else "" for v in node.inputs]


@pytest.mark.parametrize(
    ("kw", "inputs", "ops"),
    [
        ({}, ["x", "qkv", "", "", "cu", "y", "b"], []),
        ({"bias_first": True, "branch_first": True}, ["x", "qkv", "", "", "cu", "y", "b"], []),
        ({"bias": False}, ["x", "qkv", "", "", "cu", "y"], []),  # a zero bias torch.onnx dropped: skip alone
        ({"branch_read": True}, ["x", "qkv", "", "", "cu", "branch"], ["Add"]),  # the bias Add has another reader
        # the fp16 recipe: a float16 branch Cast to the float32 stream; the Cast's output is the skip
        ({"cast": True}, ["x", "qkv", "", "", "cu", "branch"], ["Add", "Cast"]),
    ],
    ids=["bias", "commuted", "no-bias", "branch-read", "cast-branch"],
)
def test_the_residual_and_bias_move_into_the_merge_with_the_same_bits(ort_session, kw, inputs, ops):
    feeds = _feeds(cast=kw.get("cast", False))
    want = ort_session(_model(**kw)).run(None, feeds)
    model = _model(**kw)
    assert merge_residual(model) == 1
    model = RemoveUnusedNodesPass()(model).model
    assert _merge_inputs(model) == inputs
    assert [n.op_type for n in model.graph] == [*ops, "RaggedMerge"]
    got = ort_session(model).run(None, feeds)
    for g, w in zip(got, want, strict=True):
        assert g.tobytes() == w.tobytes()


def test_a_sum_read_elsewhere_is_left_alone():
    """The residual sum is also a graph output: its Add must stay, and the node keeps reading it."""
    model = _model(sum_read=True)
    assert merge_residual(model) == 0
    assert _merge_inputs(model) == ["sum", "qkv", "", "", "cu"]
