"""Whole-graph passes that run before the pattern rules (not patterns: each walks the graph once).

- `fold_weight_layout`: Reshape / Transpose of initializers (the patch embedding's proj.weight.reshape(C, -1).T,
  which torch.onnx writes as two nodes) become one initializer: the file holds the layout the MatMul reads (ONNX
  Runtime folds such nodes at session start; the file no longer relies on it).
- `gemm_to_matmul`: torch.onnx writes a Linear as Gemm(x, W, b, transB=1); it becomes MatMul(x, W^T) with the
  weight transposed once in the file (+ Add(b)): the layout the CUDA EP runs fastest, and a bias Add that the
  rules can fuse.
- `drop_unused_outputs`: trailing optional outputs nobody reads leave RaggedAttention nodes (a cls_attn output
  costs a second kernel per block).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from raggedvit.exporter.rules._common import rebuild_node

__all__ = ["drop_unused_outputs", "fold_weight_layout", "gemm_to_matmul"]


def _plain_gemm(node: ir.Node) -> bool:
    a = node.attributes
    return (
        a.get_float("alpha", 1.0) == 1.0
        and a.get_float("beta", 1.0) == 1.0
        and a.get_int("transA", 0) == 0
        and a.get_int("transB", 0) == 1
    )


def gemm_to_matmul(model: ir.Model) -> int:
    """Every Gemm(x, W[, b]) with a constant 2-D W, transB=1 (alpha = beta = 1, transA = 0) -> MatMul(x, W^T)
    [+ Add(b)], W^T a new initializer (shared by Gemms of the same W). Returns the number of Gemms replaced."""
    graph = model.graph
    transposed: dict[str, ir.Value] = {}
    done = 0
    for node in list(graph):
        if node.op_type != "Gemm" or node.domain not in ("", "ai.onnx") or not _plain_gemm(node):
            continue
        x, w = node.inputs[0], node.inputs[1]
        c = node.inputs[2] if len(node.inputs) > 2 else None
        if w is None or w.const_value is None or len(w.const_value.shape) != 2:
            continue
        if w.name not in transposed:
            wt = ir.Value(name=f"{w.name}_t", const_value=ir.tensor(np.ascontiguousarray(w.const_value.numpy().T)))
            wt.shape, wt.type = wt.const_value.shape, ir.TensorType(wt.const_value.dtype)
            graph.register_initializer(wt)
            transposed[w.name] = wt
        mm = ir.node("MatMul", [x, transposed[w.name]])
        new = [mm]
        if c is not None:
            new.append(ir.node("Add", [mm.outputs[0], c]))
        for value in (n.outputs[0] for n in new):  # the product has the Gemm's shape and type, before and after + b
            value.shape, value.type = node.outputs[0].shape, node.outputs[0].type
        out = new[-1].outputs[0]
        ir.convenience.replace_nodes_and_values(graph, node, [node], new, [node.outputs[0]], [out])
        done += 1
    return done


def drop_unused_outputs(model: ir.Model, op_type: str = "RaggedAttention") -> int:
    """Trailing optional outputs nobody reads are removed from `op_type` nodes (a RaggedAttention with a cls_attn
    output computes it: a second kernel per block). Returns the number of nodes changed."""
    graph = model.graph
    graph_outputs = set(graph.outputs)
    done = 0
    for node in list(graph):
        if node.op_type != op_type:
            continue
        keep = len(node.outputs)
        while keep > 1 and not node.outputs[keep - 1].uses() and node.outputs[keep - 1] not in graph_outputs:
            keep -= 1
        if keep == len(node.outputs):
            continue
        rebuild_node(graph, node, list(node.inputs), keep)
        done += 1
    return done


def fold_weight_layout(model: ir.Model) -> int:
    """Reshape(W, shape) and Transpose(W) of constant W (and constant shape), in graph order so chains fold, ->
    one new initializer each. Returns the number of nodes folded."""
    graph = model.graph
    done = 0
    for node in list(graph):
        if node.op_type not in ("Reshape", "Transpose") or node.domain not in ("", "ai.onnx"):
            continue
        ins = [v for v in node.inputs if v is not None]
        if not ins or any(v.const_value is None for v in ins) or len(node.outputs) != 1:
            continue
        x = ins[0].const_value.numpy()
        if node.op_type == "Reshape":
            if len(ins) != 2:
                continue
            shape = [int(d) for d in ins[1].const_value.numpy().reshape(-1)]
            if not node.attributes.get_int("allowzero", 0):
                shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]  # 0: copy the input's dim
            y = x.reshape(shape)
        else:
            perm = node.attributes.get_ints("perm", None)
            y = np.transpose(x, None if perm is None else [int(a) for a in perm])
        old = node.outputs[0]
        name = f"{ins[0].name}_{node.op_type.lower()}"  # e.g. model.vit.patch_embed.proj.weight_reshape_transpose
        new = ir.Value(name=name, const_value=ir.tensor(np.ascontiguousarray(y)))
        new.shape, new.type = new.const_value.shape, ir.TensorType(new.const_value.dtype)
        graph.register_initializer(new)
        old.replace_all_uses_with(new)
        if old in graph.outputs:
            graph.outputs[graph.outputs.index(old)] = new
        graph.remove(node, safe=True)
        done += 1
    return done
