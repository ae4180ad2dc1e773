"""Token-merging rule (a whole-graph pass, like `passes`).

- `merge_residual`: RaggedMerge(Add(residual, Add(y, b)), ...) -> RaggedMerge(residual, ..., skip=y, skip_bias=b):
  a merging block's attention residual, and the proj Linear's bias before it, move into the op (its skip inputs;
  the sums rounded as the two Adds round them: `merge.residual_rows`). Between the residual and norm2 the merge
  leaves SkipLayerNormalization nothing to fuse, so without this a merging block costs the bias Add, the residual Add
  and the RaggedMerge where an unpruned block has one SkipLayerNormalization. Taken when the sum is read by that node
  alone and both its inputs have x's type and shape; the bias moves too when its Add is read by the sum alone and b
  is a constant [C] of x's type. A branch that is no bias Add (a zero bias torch.onnx dropped, LayerScale's Mul, the
  fp16 recipe's Cast of a float16 branch to the float32 stream) becomes skip alone.
"""

from __future__ import annotations

import onnx_ir as ir

from raggedvit.exporter.rules._common import RAGGED, producer, rank1_const, rebuild_node

__all__ = ["merge_residual"]

_X, _SKIP = 0, 5  # RaggedMerge input positions: x, then skip and skip_bias after cu (custom_ops/ragged_merge.h)


def _read_once(value: ir.Value, graph: ir.Graph) -> bool:
    return len(value.uses()) == 1 and value not in graph.outputs


def _same_rows(a: ir.Value, b: ir.Value) -> bool:
    """Both [T, C] of one element type (C static, equal; T equal where both are known)."""
    if a.dtype is None or a.dtype != b.dtype or a.shape is None or b.shape is None:
        return False
    return a.shape.rank() == b.shape.rank() == 2 and isinstance(a.shape[1], int) and a.shape[1] == b.shape[1]


def _split_bias(branch: ir.Value, graph: ir.Graph) -> tuple[ir.Value, ir.Value | None]:
    """(y, b) when branch = Add(y, b) with b a constant [C] of y's type and the sum read only here; else (branch,
    None)."""
    add = producer(branch, "Add")
    if add is None or not _read_once(branch, graph):
        return branch, None
    for y, b in (add.inputs, reversed(add.inputs)):
        if (
            y is not None
            and b is not None
            and rank1_const(b)
            and b.dtype == branch.dtype
            and _same_rows(y, branch)
            and b.const_value.shape[0] == branch.shape[1]
        ):
            return y, b
    return branch, None


def merge_residual(model: ir.Model) -> int:
    """Every RaggedMerge whose x is Add(residual, branch) read by it alone -> RaggedMerge(residual, qkv, qkv_bias,
    size, cu, skip, skip_bias) (module docstring). Returns the number of nodes changed."""
    graph = model.graph
    done = 0
    for node in list(graph):
        if node.op_type != "RaggedMerge" or node.domain != RAGGED or len(node.inputs) > _SKIP:
            continue
        total = node.inputs[_X]
        add = producer(total, "Add")
        if add is None or not _read_once(total, graph) or not all(v is not None for v in add.inputs):
            continue
        a, b = add.inputs
        if not (_same_rows(a, total) and _same_rows(b, total)):
            continue
        residual, branch = (b, a) if _split_bias(a, graph)[1] is not None else (a, b)
        skip, skip_bias = _split_bias(branch, graph)
        inputs = list(node.inputs) + [None] * (_SKIP - len(node.inputs)) + [skip, skip_bias]
        inputs[_X] = residual
        if skip_bias is None:
            inputs.pop()
        rebuild_node(graph, node, inputs, len(node.outputs))
        done += 1
    return done
