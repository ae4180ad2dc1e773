"""The index clean-ups (raggedvit/exporter/rules/index.py) on hand-built graphs."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import rewrite

from raggedvit.exporter.rules.index import FlatReshape, Gather1d

from ._graphs import const, run


def _graph(nodes: list[ir.Node], inputs: list[ir.Value], inits: list[ir.Value]) -> ir.Model:
    out = nodes[-1].outputs[0]
    out.name = "out"
    return ir.Model(ir.Graph(inputs, [out], nodes=nodes, initializers=inits, opset_imports={"": 20}), ir_version=10)


def _flat_model(rank: int) -> ir.Model:
    """Reshape(x, [-1]) of x [6] (rank 1) or [2, 3] (rank 2), then Neg (so the reshape is not the output)."""
    x = ir.Value(name="x", shape=ir.Shape([6] if rank == 1 else [2, 3]), type=ir.TensorType(ir.DataType.FLOAT))
    shape = const("shape", np.array([-1], np.int64))
    reshape = ir.node("Reshape", [x, shape])
    return _graph([reshape, ir.node("Neg", [reshape.outputs[0]])], [x], [shape])


def test_flat_reshape_drops_the_reshape_of_1d_rows():
    feeds = {"x": np.arange(6, dtype=np.float32)}
    want = run(_flat_model(1), feeds)
    model = rewrite(_flat_model(1), pattern_rewrite_rules=[FlatReshape.rule("flat_reshape")])
    assert "Reshape" not in [n.op_type for n in model.graph]
    np.testing.assert_array_equal(run(model, feeds), want)


def test_flat_reshape_keeps_a_real_flattening():
    model = rewrite(_flat_model(2), pattern_rewrite_rules=[FlatReshape.rule("flat_reshape")])
    assert [n.op_type for n in model.graph] == ["Reshape", "Neg"]


def _gather_nd_model(x_shape: list[int], batch_dims: int = 0) -> ir.Model:
    """GatherND(x, Unsqueeze(i [3], [-1])) with x float of `x_shape`, i int64."""
    x = ir.Value(name="x", shape=ir.Shape(x_shape), type=ir.TensorType(ir.DataType.FLOAT))
    i = ir.Value(name="i", shape=ir.Shape([3]), type=ir.TensorType(ir.DataType.INT64))
    axes = const("axes", np.array([-1], np.int64))
    unsq = ir.node("Unsqueeze", [i, axes])
    unsq.outputs[0].shape = ir.Shape([3, 1])
    gnd = ir.node("GatherND", [x, unsq.outputs[0]], {"batch_dims": batch_dims})
    return _graph([unsq, gnd], [x, i], [axes])


def test_gather_1d_turns_a_gather_nd_of_1d_values_into_a_gather():
    feeds = {"x": np.arange(7, dtype=np.float32) * 1.5, "i": np.array([4, 0, 6], np.int64)}
    want = run(_gather_nd_model([7]), feeds)
    model = rewrite(_gather_nd_model([7]), pattern_rewrite_rules=[Gather1d.rule("gather_1d")])
    assert [n.op_type for n in model.graph] == ["Gather"]
    np.testing.assert_array_equal(run(model, feeds), want)


def test_gather_1d_keeps_a_gather_nd_of_rows():
    model = rewrite(_gather_nd_model([7, 2]), pattern_rewrite_rules=[Gather1d.rule("gather_1d")])
    assert [n.op_type for n in model.graph] == ["Unsqueeze", "GatherND"]
