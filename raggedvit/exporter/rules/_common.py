"""Helpers shared by the rule modules: operator domains, shape and constant tests on values, and the rows that
com.raggedvit::GatherLayerNorm's kernels take."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

MS = "com.microsoft"
RAGGED = "com.raggedvit"


def rank1_const(value: ir.Value) -> bool:
    return value.const_value is not None and len(value.const_value.shape) == 1


def rank(value: ir.Value) -> int | None:
    return value.shape.rank() if value.shape is not None else None


def const_ints(value: ir.Value) -> list[int] | None:
    if value.const_value is None:
        return None
    return [int(v) for v in value.const_value.numpy().reshape(-1)]


def producer(value: ir.Value | None, op_type: str) -> ir.Node | None:
    node = value.producer() if value is not None else None
    return node if node is not None and node.op_type == op_type and node.domain in ("", "ai.onnx") else None


def not_row_norm(ln: ir.Value) -> str | None:
    """Why the LayerNormalization producing `ln` is not a float32-stash norm over the rows' last axis (axis -1, or 1
    of the rank-2 rows that `not_norm_kernel_rows` requires), None when it is."""
    attrs = ln.producer().attributes
    if attrs.get_int("axis", -1) not in (-1, 1) or attrs.get_int("stash_type", 1) != 1:
        return "not a float32-stash LayerNormalization over the last axis"
    return None


def not_norm_kernel_rows(x: ir.Value, gamma: ir.Value, beta: ir.Value) -> str | None:
    """Why com.raggedvit::GatherLayerNorm's kernels do not take the rows x with weights gamma, beta, None when they
    do: float16 [T, D] rows (not a constant) of a static D that is a multiple of 16 up to the CUDA kernel's widest
    row, gamma / beta constant 1-D tensors of x's dtype."""
    if rank(x) != 2 or x.dtype != ir.DataType.FLOAT16 or x.const_value is not None:
        return "not float16 [T, D] rows"
    from raggedvit.kernels._norm_kernel import NORM_BLOCK_DS  # the CUDA kernel's widest row: its cubins' last

    D = x.shape[1]
    if not isinstance(D, int) or D % 16 != 0 or D > max(NORM_BLOCK_DS):
        return f"D not static, not a multiple of 16 or above {max(NORM_BLOCK_DS)}"
    if not (rank1_const(gamma) and rank1_const(beta) and gamma.dtype == beta.dtype == x.dtype):
        return "gamma / beta are not constant 1-D tensors of x's dtype"
    return None


def typed(value: ir.Value, dtype: ir.DataType | None, shape: ir.Shape | None = None) -> ir.Value:
    """`value` (a tensor a rule creates, not one that replaces a matched output: those take the matched value's type)
    with its element type and shape set (dtype None: the value it derives from has none, nor has it): every value of
    an export has a recorded type, which the CUDA placement check (exporter/placement.py) and the rules' dtype checks
    read. Returns it."""
    value.type, value.shape = (ir.TensorType(dtype) if dtype is not None else None), shape
    return value


def rebuild_node(graph: ir.Graph, node: ir.Node, inputs: list[ir.Value | None], num_outputs: int) -> ir.Node:
    """Replace `node` in `graph` by a node of the same op, domain, attributes and name reading `inputs`, with its
    first `num_outputs` outputs (each keeping its name, shape and type, and its readers). Returns the new node."""
    new = ir.node(
        node.op_type,
        inputs,
        {a.name: a for a in node.attributes.values()},
        domain=node.domain,
        num_outputs=num_outputs,
        name=node.name,
    )
    old = list(node.outputs[:num_outputs])
    for before, value in zip(old, new.outputs):
        value.name, value.shape, value.type = before.name, before.shape, before.type
    ir.convenience.replace_nodes_and_values(graph, node, [node], [new], old, list(new.outputs))
    return new


def type_norm_stats(mean: ir.Value, inv_std: ir.Value) -> None:
    """Type com.microsoft::SkipLayerNormalization's mean and inv_std_var outputs (not read): float32, its schema's
    only type for them (type constraint U), whatever the rows' type."""
    for value in (mean, inv_std):
        typed(value, ir.DataType.FLOAT)


def row_range(op, x: ir.Value, name: str) -> ir.Value:
    """Range(0, T, 1) over the rows of x [T, D] (int64; T from Shape / Squeeze, which ONNX Runtime folds into an
    initializer once the batch is fixed): GatherLayerNorm's identity index."""
    start = op.initializer(ir.tensor(np.array(0, dtype=np.int64)), name=f"{name}_rows_start")
    delta = op.initializer(ir.tensor(np.array(1, dtype=np.int64)), name=f"{name}_rows_delta")
    first = typed(op.Shape(x, start=0, end=1), ir.DataType.INT64, ir.Shape([1]))
    rows = typed(op.Squeeze(first), ir.DataType.INT64, ir.Shape([]))  # T as an int64 scalar
    return typed(op.Range(start, rows, delta), ir.DataType.INT64, ir.Shape([x.shape[0]]) if rank(x) else None)
