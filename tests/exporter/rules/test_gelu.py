"""The GELU rules (raggedvit/exporter/rules/gelu.py) on hand-built graphs."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from raggedvit.exporter.rules import fuse_for_ort

from ._graphs import const as _const


def _gelu_model(dtype: ir.DataType, n: int, with_bias: bool) -> ir.Model:
    """Gelu(Add(y [3, n], b [n])) (or Gelu(y)) in `dtype`."""
    y = ir.Value(name="y", shape=ir.Shape([3, n]), type=ir.TensorType(dtype))
    nodes, inits, g_in = [], [], y
    if with_bias:
        b = _const("b", np.ones(n, dtype=dtype.numpy()))
        add = ir.node("Add", [y, b])
        add.outputs[0].shape, add.outputs[0].type = y.shape, y.type
        nodes, inits, g_in = [add], [b], add.outputs[0]
    gelu = ir.node("Gelu", [g_in], {"approximate": "none"})
    gelu.outputs[0].name, gelu.outputs[0].shape, gelu.outputs[0].type = "g", y.shape, y.type
    graph = ir.Graph([y], [gelu.outputs[0]], nodes=[*nodes, gelu], initializers=inits, opset_imports={"": 20})
    return ir.Model(graph, ir_version=10)


@pytest.mark.parametrize(
    ("dtype", "n", "with_bias", "domain", "inputs"),
    [
        (ir.DataType.FLOAT16, 48, True, "com.raggedvit", 2),
        (ir.DataType.FLOAT16, 48, False, "com.raggedvit", 1),  # no zero bias to read
        (ir.DataType.FLOAT16, 40, True, "com.microsoft", 2),  # width not a multiple of 16: no CUDA kernel of ours
        (ir.DataType.FLOAT, 48, True, "com.microsoft", 2),
        (ir.DataType.FLOAT, 48, False, "com.microsoft", 2),  # ONNX Runtime's op with a zero bias
    ],
)
def test_bias_gelu_and_zero_bias_gelu_pick_the_op(dtype, n, with_bias, domain, inputs):
    model = fuse_for_ort(_gelu_model(dtype, n, with_bias))
    (node,) = list(model.graph)
    assert (node.domain, node.op_type, len(node.inputs)) == (domain, "BiasGelu", inputs)
