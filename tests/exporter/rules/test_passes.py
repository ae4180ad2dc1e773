"""The whole-graph passes of raggedvit/exporter/rules/passes.py on hand-built graphs."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from raggedvit.exporter.rules.passes import fold_weight_layout

from ._graphs import const as _const


def _model(w: np.ndarray, shape: list[int], perm: list[int] | None, allowzero: int = 0) -> tuple[ir.Model, ir.Value]:
    """x @ Transpose(Reshape(W, shape)) with W and shape initializers; returns the model and x."""
    x = ir.Value(name="x", shape=ir.Shape([2, w.size // w.shape[0]]), type=ir.TensorType(ir.DataType.FLOAT))
    wv, sv = _const("w", w), _const("shape", np.array(shape, dtype=np.int64))
    reshape = ir.node("Reshape", [wv, sv], {"allowzero": allowzero})
    attrs = {} if perm is None else {"perm": perm}
    transpose = ir.node("Transpose", [reshape.outputs[0]], attrs)
    mm = ir.node("MatMul", [x, transpose.outputs[0]])
    mm.outputs[0].name = "y"
    graph = ir.Graph(
        [x], [mm.outputs[0]], nodes=[reshape, transpose, mm], initializers=[wv, sv], opset_imports={"": 20}
    )
    return ir.Model(graph, ir_version=10), x


def test_reshape_then_transpose_of_a_weight_become_one_initializer():
    w = np.arange(4 * 3 * 2 * 2, dtype=np.float32).reshape(4, 3, 2, 2)  # a conv weight [C, cin, ph, pw]
    model, _ = _model(w, [4, -1], None)
    assert fold_weight_layout(model) == 2
    ops = [n.op_type for n in model.graph]
    assert ops == ["MatMul"]
    folded = model.graph.node(0).inputs[1]
    assert folded.name == "w_reshape_transpose" and folded.name in model.graph.initializers
    np.testing.assert_array_equal(folded.const_value.numpy(), w.reshape(4, -1).T)


def test_explicit_perm_and_zero_dims():
    w = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    model, _ = _model(w, [0, 12], [1, 0])  # allowzero 0: the 0 copies W's first dim
    assert fold_weight_layout(model) == 2
    np.testing.assert_array_equal(model.graph.node(0).inputs[1].const_value.numpy(), w.reshape(2, 12).T)


def test_nodes_with_a_runtime_input_are_left_alone():
    w = np.ones((4, 6), dtype=np.float32)
    model, x = _model(w, [4, 6], None)
    reshape = model.graph.node(0)
    reshape.replace_input_with(0, x)  # Reshape(x, shape): not a constant
    assert fold_weight_layout(model) == 0
    assert [n.op_type for n in model.graph] == ["Reshape", "Transpose", "MatMul"]


def _gemm_model(trans_b: int = 1, *, shared: bool = False) -> ir.Model:
    """Gemm(x [2, 4], W [3, 4], b [3], transB) (twice over the same W when shared, the sum as the output)."""
    gen = np.random.default_rng(3)
    x = ir.Value(name="x", shape=ir.Shape([2, 4]), type=ir.TensorType(ir.DataType.FLOAT))
    w = _const("w", gen.standard_normal((3, 4) if trans_b else (4, 3)).astype(np.float32))
    b = _const("b", gen.standard_normal(3).astype(np.float32))
    nodes = [ir.node("Gemm", [x, w, b], {"transB": trans_b}) for _ in range(2 if shared else 1)]
    for n in nodes:
        n.outputs[0].shape, n.outputs[0].type = ir.Shape([2, 3]), x.type
    if shared:
        nodes.append(ir.node("Add", [nodes[0].outputs[0], nodes[1].outputs[0]]))
    out = nodes[-1].outputs[0]
    out.name = "out"
    graph = ir.Graph([x], [out], nodes=nodes, initializers=[w, b], opset_imports={"": 20})
    return ir.Model(graph, ir_version=10)


def test_gemm_becomes_matmul_by_the_transposed_weight_plus_bias():
    from raggedvit.exporter.rules.passes import gemm_to_matmul

    from ._graphs import run

    feeds = {"x": np.random.default_rng(4).standard_normal((2, 4)).astype(np.float32)}
    want = run(_gemm_model(shared=True), feeds)
    model = _gemm_model(shared=True)
    assert gemm_to_matmul(model) == 2
    assert [n.op_type for n in model.graph] == ["MatMul", "Add", "MatMul", "Add", "Add"]
    assert "w_t" in model.graph.initializers and model.graph.initializers["w_t"].const_value.shape == (4, 3)
    mms = [n for n in model.graph if n.op_type == "MatMul"]
    assert mms[0].inputs[1] is mms[1].inputs[1]  # one transposed copy of a shared weight
    # the product before the bias keeps the Gemm's type and shape: the rules that fuse the bias Add away read its
    # dtype (bias_gelu's kernel choice), and the file records it (the CUDA placement check reads node types)
    for n in list(model.graph)[:4]:  # each Gemm's MatMul and Add (the last node is the graph's own sum)
        assert (n.outputs[0].dtype, n.outputs[0].shape) == (ir.DataType.FLOAT, ir.Shape([2, 3])), n
    np.testing.assert_allclose(run(model, feeds), want, rtol=1e-6, atol=1e-6)


def test_gemm_without_trans_b_is_left_alone():
    from raggedvit.exporter.rules.passes import gemm_to_matmul

    model = _gemm_model(trans_b=0)
    assert gemm_to_matmul(model) == 0
    assert [n.op_type for n in model.graph] == ["Gemm"]


def test_unread_trailing_outputs_of_ragged_attention_are_dropped():
    from raggedvit.exporter.rules.passes import drop_unused_outputs

    x = ir.Value(name="x", shape=ir.Shape([4, 8]), type=ir.TensorType(ir.DataType.FLOAT))
    attn = ir.node("RaggedAttention", [x], {"num_heads": 2}, domain="com.raggedvit", num_outputs=2, name="attn")
    attn.outputs[0].name, attn.outputs[1].name = "out", "cls_attn"
    kept = ir.node("RaggedAttention", [x], domain="com.raggedvit", num_outputs=2, name="kept")
    kept.outputs[0].name, kept.outputs[1].name = "out2", "cls_attn2"
    graph = ir.Graph([x], [attn.outputs[0], kept.outputs[1]], nodes=[attn, kept],
                     opset_imports={"": 20, "com.raggedvit": 1})  # fmt: skip
    model = ir.Model(graph, ir_version=10)
    assert drop_unused_outputs(model) == 1
    by_name = {n.name: n for n in model.graph}
    assert len(by_name["attn"].outputs) == 1 and by_name["attn"].outputs[0] is model.graph.outputs[0]
    assert by_name["attn"].attributes["num_heads"].as_int() == 2
    assert len(by_name["kept"].outputs) == 2  # its cls_attn is read
