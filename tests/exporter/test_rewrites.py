"""Graph passes of raggedvit/exporter/rewrites.py on hand-built graphs."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from raggedvit.exporter.rewrites import fold_weight_layout, fuse_for_ort


def _const(name: str, array: np.ndarray) -> ir.Value:
    value = ir.Value(name=name, const_value=ir.tensor(array))
    value.shape, value.type = value.const_value.shape, ir.TensorType(value.const_value.dtype)
    return value


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


def _run(model: ir.Model, feeds: dict[str, np.ndarray]) -> np.ndarray:
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(ir.serde.serialize_model(model)).run(None, feeds)[0]


def test_patch_bias_joins_the_position_table():
    from onnxscript.rewriter import rewrite

    from raggedvit.exporter.rewrites import PatchBiasIntoPosition

    gen = np.random.default_rng(1)
    feeds = {"prefix": gen.standard_normal((2, 1, 8)).astype(np.float32)}
    feeds["y"] = gen.standard_normal((2, 6, 8)).astype(np.float32)
    want = _run(_embedding_model(1, 6, 8), feeds)
    model = rewrite(_embedding_model(1, 6, 8), pattern_rewrite_rules=[PatchBiasIntoPosition.rule("p")])
    assert [n.op_type for n in model.graph] == ["Concat", "Add"]  # no bias Add left
    np.testing.assert_allclose(_run(model, feeds), want, rtol=1e-6, atol=1e-6)


def test_patch_bias_rule_needs_a_row_concat():
    from onnxscript.rewriter import rewrite

    from raggedvit.exporter.rewrites import PatchBiasIntoPosition

    model = rewrite(_embedding_model(1, 6, 8, axis=2), pattern_rewrite_rules=[PatchBiasIntoPosition.rule("p")])
    assert [n.op_type for n in model.graph] == ["Add", "Concat", "Add"]


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
def test_gelu_rules_pick_the_op(dtype, n, with_bias, domain, inputs):
    model = fuse_for_ort(_gelu_model(dtype, n, with_bias))
    (node,) = list(model.graph)
    assert (node.domain, node.op_type, len(node.inputs)) == (domain, "BiasGelu", inputs)


def _gather_norm_model(dtype: ir.DataType, D: int, *, skip: bool, bias: bool, add_used: bool = False) -> ir.Model:
    """LayerNormalization(Gather(S, i)) with S = x, Add(x, y) or Add(x, Add(y, b)) (x, y [6, D] inputs, i [4]
    int64); the gathered rows are a graph output too (the next block's residual), and so is S when add_used."""
    T = 6
    x = ir.Value(name="x", shape=ir.Shape([T, D]), type=ir.TensorType(dtype))
    y = ir.Value(name="y", shape=ir.Shape([T, D]), type=ir.TensorType(dtype))
    i = ir.Value(name="i", shape=ir.Shape([4]), type=ir.TensorType(ir.DataType.INT64))
    npt = dtype.numpy()
    gamma, beta = (
        _const("gamma", np.linspace(0.5, 1.5, D).astype(npt)),
        _const("beta", np.linspace(-1, 1, D).astype(npt)),
    )
    nodes, inits, total = [], [gamma, beta], x
    branch = y
    if bias:
        b = _const("b", np.linspace(-0.3, 0.3, D).astype(npt))
        add_b = ir.node("Add", [y, b])
        add_b.outputs[0].shape, add_b.outputs[0].type = x.shape, x.type
        nodes, inits, branch = [add_b], [*inits, b], add_b.outputs[0]
    if skip:
        add = ir.node("Add", [x, branch])
        add.outputs[0].name, add.outputs[0].shape, add.outputs[0].type = "s", x.shape, x.type
        nodes, total = [*nodes, add], add.outputs[0]
    gather = ir.node("Gather", [total, i], {"axis": 0})
    gather.outputs[0].name, gather.outputs[0].shape, gather.outputs[0].type = "g", ir.Shape([4, D]), x.type
    ln = ir.node("LayerNormalization", [gather.outputs[0], gamma, beta], {"axis": -1, "epsilon": 1e-6})
    ln.outputs[0].name, ln.outputs[0].shape, ln.outputs[0].type = "n", ir.Shape([4, D]), x.type
    outputs = [ln.outputs[0], gather.outputs[0]] + ([total] if add_used and skip else [])
    inputs = [x, i] + ([y] if skip or bias else [])
    graph = ir.Graph(inputs, outputs, nodes=[*nodes, gather, ln], initializers=inits, opset_imports={"": 20})
    return ir.Model(graph, ir_version=10)


@pytest.mark.parametrize(
    ("dtype", "D", "skip", "bias", "add_used", "ops", "norm_inputs"),
    [
        (ir.DataType.FLOAT16, 48, False, False, False, ["GatherLayerNorm"], 4),
        # the residual Add stays (fused into the GEMM by ONNX Runtime; rewrites.py says why it is not absorbed)
        (ir.DataType.FLOAT16, 48, True, False, False, ["Add", "GatherLayerNorm"], 4),
        (ir.DataType.FLOAT16, 48, True, True, True, ["Add", "Add", "GatherLayerNorm"], 4),
        (ir.DataType.FLOAT16, 40, True, False, False, ["Add", "Gather", "LayerNormalization"], 0),  # D % 16 != 0
        (ir.DataType.FLOAT16, 4112, False, False, False, ["Gather", "LayerNormalization"], 0),  # D > 4096
        (ir.DataType.FLOAT, 48, True, False, False, ["Add", "Gather", "LayerNormalization"], 0),  # float32 rows
    ],
)
def test_gather_layer_norm_rules(ort_session, dtype, D, skip, bias, add_used, ops, norm_inputs):
    before = _gather_norm_model(dtype, D, skip=skip, bias=bias, add_used=add_used)
    gen = np.random.default_rng(2)
    npt = dtype.numpy()
    feeds = {"x": gen.standard_normal((6, D)).astype(npt), "i": np.array([5, 0, -1, 2], dtype=np.int64)}
    if skip or bias:
        feeds["y"] = gen.standard_normal((6, D)).astype(npt)
    want = ort_session(before).run(None, feeds)
    model = fuse_for_ort(_gather_norm_model(dtype, D, skip=skip, bias=bias, add_used=add_used))
    assert [n.op_type for n in model.graph] == ops
    if norm_inputs:
        node = next(n for n in model.graph if n.op_type == "GatherLayerNorm")
        assert node.domain == "com.raggedvit" and len(node.inputs) == norm_inputs
        assert node.attributes["epsilon"].as_float() == pytest.approx(1e-6)
    got = ort_session(model).run(None, feeds)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32), rtol=2e-3, atol=2e-3)


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


def _rows_norm_model(
    dtype: ir.DataType, D: int, *, rank: int = 2, first: str = "", rows: int | str = 6, images: bool = False
) -> ir.Model:
    """LayerNormalization(x [rows, D]) (rank 3: x [2, 3, D]) with x a graph input, Gather(x, i) (first="gather", i
    [4] int64), Add(x, y) (first="add", y [rows, D]) or, with images, Reshape(images [batch, 3, D], [-1, D]): the
    export's rows [batch*3, D] of a symbolic batch."""
    npt = dtype.numpy()
    shape = [rows, D] if rank == 2 else [2, 3, D]
    x = ir.Value(name="x", shape=ir.Shape(shape), type=ir.TensorType(dtype))
    gamma = _const("gamma", np.linspace(0.5, 1.5, D).astype(npt))
    beta = _const("beta", np.linspace(-1, 1, D).astype(npt))
    inputs, nodes, inits, rows_in = [x], [], [gamma, beta], x
    if images:
        x.name, x.shape = "images", ir.Shape(["batch", 3, D])
        flat = ir.node("Reshape", [x, _const("flat", np.array([-1, D], np.int64))])
        flat.outputs[0].shape, flat.outputs[0].type = ir.Shape(["3*batch", D]), x.type
        nodes, inits, rows_in = [flat], [*inits, flat.inputs[1]], flat.outputs[0]
    elif first == "gather":
        i = ir.Value(name="i", shape=ir.Shape([4]), type=ir.TensorType(ir.DataType.INT64))
        gather = ir.node("Gather", [x, i], {"axis": 0})
        gather.outputs[0].shape, gather.outputs[0].type = ir.Shape([4, D]), x.type
        inputs, nodes, rows_in = [x, i], [gather], gather.outputs[0]
    elif first == "add":
        y = ir.Value(name="y", shape=x.shape, type=x.type)
        add = ir.node("Add", [x, y])
        add.outputs[0].shape, add.outputs[0].type = x.shape, x.type
        inputs, nodes, rows_in = [x, y], [add], add.outputs[0]
    ln = ir.node("LayerNormalization", [rows_in, gamma, beta], {"axis": -1, "epsilon": 1e-6})
    ln.outputs[0].name, ln.outputs[0].shape, ln.outputs[0].type = "n", rows_in.shape, x.type
    graph = ir.Graph(inputs, [ln.outputs[0]], nodes=[*nodes, ln], initializers=inits, opset_imports={"": 20})
    return ir.Model(graph, ir_version=10)


_ROWS_OPS = ["Shape", "Squeeze", "Range", "GatherLayerNorm"]


@pytest.mark.parametrize(
    ("dtype", "D", "kwargs", "ops"),
    [
        (ir.DataType.FLOAT16, 48, {}, _ROWS_OPS),
        (ir.DataType.FLOAT16, 48, {"rows": "T"}, _ROWS_OPS),  # a symbolic row count
        (ir.DataType.FLOAT, 48, {}, ["LayerNormalization"]),  # float32 rows
        (ir.DataType.FLOAT16, 40, {}, ["LayerNormalization"]),  # D % 16 != 0
        (ir.DataType.FLOAT16, 4112, {}, ["LayerNormalization"]),  # D > 4096
        (ir.DataType.FLOAT16, 48, {"rank": 3}, ["LayerNormalization"]),  # not [T, D] rows
        (ir.DataType.FLOAT16, 48, {"first": "gather"}, ["GatherLayerNorm"]),  # gather_layer_norm's: no Range
        (ir.DataType.FLOAT16, 48, {"first": "add"}, ["SkipLayerNormalization"]),  # skip_layer_norm_plain's
    ],
    ids=["f16", "f16_symbolic_rows", "f32", "d40", "d4112", "rank3", "gather", "add"],
)
def test_layer_norm_rows_rule(ort_session, dtype, D, kwargs, ops):
    gen = np.random.default_rng(6)
    npt = dtype.numpy()
    shape = (6, D) if kwargs.get("rank", 2) == 2 else (2, 3, D)
    feeds = {"x": gen.standard_normal(shape).astype(npt)}
    if kwargs.get("first") == "gather":
        feeds["i"] = np.array([5, 0, -1, 2], dtype=np.int64)
    if kwargs.get("first") == "add":
        feeds["y"] = gen.standard_normal(shape).astype(npt)
    want = ort_session(_rows_norm_model(dtype, D, **kwargs)).run(None, feeds)
    model = fuse_for_ort(_rows_norm_model(dtype, D, **kwargs))
    assert [n.op_type for n in model.graph] == ops
    node = list(model.graph)[-1]  # the norm
    if ops[-1] == "GatherLayerNorm":
        assert node.domain == "com.raggedvit" and len(node.inputs) == 4
        assert node.attributes["epsilon"].as_float() == pytest.approx(1e-6)
        assert node.outputs[0].name == "n" and not node.outputs[1].uses()  # the Sum output is not read
    if ops == _ROWS_OPS:
        assert node.inputs[0].name == "x" and node.inputs[1].producer().op_type == "Range"
    got = ort_session(model).run(None, feeds)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32), rtol=2e-3, atol=2e-3)


def test_layer_norm_rows_index_folds_with_a_fixed_batch(tmp_path):
    """The export's rows [batch*k, D] of images [batch, ...]: with the batch fixed (create_session(batch=), ONNX
    Runtime's free-dimension override), its constant folding turns Shape / Squeeze / Range into an index initializer
    at session start; with a free batch they stay."""
    import onnx

    from raggedvit.runtime import create_session, session_options

    from .conftest import to_proto

    model = to_proto(fuse_for_ort(_rows_norm_model(ir.DataType.FLOAT16, 48, images=True))).SerializeToString()
    feeds = {"images": np.random.default_rng(7).standard_normal((2, 3, 48)).astype(np.float16)}
    optimized = {}
    for batch in (None, 2):
        opts = session_options()
        opts.optimized_model_filepath = str(tmp_path / f"optimized_{batch}.onnx")
        (got,) = create_session(model, "cpu", options=opts, batch=batch).run(None, feeds)
        optimized[batch] = onnx.load(opts.optimized_model_filepath).graph
    assert [n.op_type for n in optimized[None].node] == ["Reshape", *_ROWS_OPS]
    assert [n.op_type for n in optimized[2].node] == ["Reshape", "GatherLayerNorm"]
    norm = optimized[2].node[1]
    index = {t.name: t for t in optimized[2].initializer}[norm.input[1]]
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(index), np.arange(6))
    rows = feeds["images"].reshape(6, 48).astype(np.float32)
    mean, var = rows.mean(-1, keepdims=True), rows.var(-1, keepdims=True)
    gamma, beta = np.linspace(0.5, 1.5, 48).astype(np.float32), np.linspace(-1, 1, 48).astype(np.float32)
    gamma, beta = gamma.astype(np.float16).astype(np.float32), beta.astype(np.float16).astype(np.float32)
    want = (rows - mean) / np.sqrt(var + 1e-6) * gamma + beta
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-3, atol=2e-3)


def _ragged_norm_model(dtype: ir.DataType, N: int, *, live_rows: bool = True) -> ir.Model:
    """LayerNormalization(RaggedLinear(x [9, 32], W [N, 32], b [N], residual [9, N], cu [3])) (a capacity layout's
    proj / fc2 and the next norm); the RaggedLinear output (the next residual) is a graph output too."""
    npt = dtype.numpy()
    gen = np.random.default_rng(8)
    x = ir.Value(name="x", shape=ir.Shape([9, 32]), type=ir.TensorType(dtype))
    residual = ir.Value(name="residual", shape=ir.Shape([9, N]), type=ir.TensorType(dtype))
    cu = ir.Value(name="cu", shape=ir.Shape([3]), type=ir.TensorType(ir.DataType.INT64))
    w = _const("w", (gen.standard_normal((N, 32)) / 6).astype(npt))
    b = _const("b", np.linspace(-0.3, 0.3, N).astype(npt))
    gamma = _const("gamma", np.linspace(0.5, 1.5, N).astype(npt))
    beta = _const("beta", np.linspace(-1, 1, N).astype(npt))
    gemm = ir.node("RaggedLinear", [x, w, b, residual, cu if live_rows else None], domain="com.raggedvit")
    gemm.outputs[0].name, gemm.outputs[0].shape, gemm.outputs[0].type = "y", residual.shape, residual.type
    ln = ir.node("LayerNormalization", [gemm.outputs[0], gamma, beta], {"axis": -1, "epsilon": 1e-6})
    ln.outputs[0].name, ln.outputs[0].shape, ln.outputs[0].type = "n", residual.shape, residual.type
    graph = ir.Graph([x, residual, cu], [ln.outputs[0], gemm.outputs[0]], nodes=[gemm, ln],
                     initializers=[w, b, gamma, beta], opset_imports={"": 20, "com.raggedvit": 1})  # fmt: skip
    return ir.Model(graph, ir_version=10)


@pytest.mark.parametrize(
    ("dtype", "N", "norm"),
    [
        (ir.DataType.FLOAT16, 48, "GatherLayerNorm"),
        (ir.DataType.FLOAT, 48, "SkipLayerNormalization"),  # float32 rows: ONNX Runtime's kernel
        (ir.DataType.FLOAT16, 40, "SkipLayerNormalization"),  # D % 16 != 0: no CUDA kernel of ours
    ],
    ids=["f16", "f32", "f16_d40"],
)
@pytest.mark.parametrize("live", [9, 5, 0])
def test_ragged_linear_skip_layer_norm_rule(ort_session, dtype, N, norm, live):
    """The residual leaves RaggedLinear's epilogue for the norm: com.raggedvit::GatherLayerNorm(y, Range(0, T, 1),
    gamma, beta, residual, -, cu) where its kernel takes the rows (its dead rows past cu[B] are neither read nor
    written), else SkipLayerNormalization; the live rows of both outputs are the unfused graph's."""
    gen = np.random.default_rng(9)
    npt = dtype.numpy()
    feeds = {"x": gen.standard_normal((9, 32)).astype(npt), "residual": gen.standard_normal((9, N)).astype(npt),
             "cu": np.array([0, min(live, 4), live], dtype=np.int64)}  # fmt: skip
    want = ort_session(_ragged_norm_model(dtype, N)).run(None, feeds)
    model = fuse_for_ort(_ragged_norm_model(dtype, N))
    ops = [n.op_type for n in model.graph]
    assert ops.count(norm) == 1 and ops.count("LayerNormalization") == 0, ops
    gemm = next(n for n in model.graph if n.op_type == "RaggedLinear")
    assert gemm.inputs[3] is None and gemm.inputs[4].name == "cu"  # the residual left the epilogue
    node = next(n for n in model.graph if n.op_type == norm)
    if norm == "GatherLayerNorm":
        assert node.domain == "com.raggedvit" and len(node.inputs) == 7
        assert node.inputs[0] is gemm.outputs[0] and node.inputs[1].producer().op_type == "Range"
        assert [v.name if v is not None else None for v in node.inputs[2:]] == ["gamma", "beta", "residual", None,
                                                                                  "cu"]  # fmt: skip
        assert node.attributes["epsilon"].as_float() == pytest.approx(1e-6)
    got = ort_session(model).run(None, feeds)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g[:live].astype(np.float32), w[:live].astype(np.float32), rtol=4e-3, atol=4e-3)
        if norm == "GatherLayerNorm":
            assert not g[live:].any()  # the CPU EP writes zeros to the dead rows (the op leaves them unspecified)


def test_ragged_linear_skip_layer_norm_rule_needs_the_live_count(ort_session):
    """A RaggedLinear without CuSeqlens is not the rule's pattern: the residual stays in the epilogue and
    layer_norm_rows takes the LayerNormalization (GatherLayerNorm without Skip or CuSeqlens)."""
    gen = np.random.default_rng(10)
    feeds = {"x": gen.standard_normal((9, 32)).astype(np.float16),
             "residual": gen.standard_normal((9, 48)).astype(np.float16),
             "cu": np.array([0, 9, 9], np.int64)}  # fmt: skip
    want = ort_session(_ragged_norm_model(ir.DataType.FLOAT16, 48, live_rows=False)).run(None, feeds)
    model = fuse_for_ort(_ragged_norm_model(ir.DataType.FLOAT16, 48, live_rows=False))
    gemm = next(n for n in model.graph if n.op_type == "RaggedLinear")
    norm = next(n for n in model.graph if n.op_type == "GatherLayerNorm")
    assert gemm.inputs[3].name == "residual" and len(norm.inputs) == 4
    got = ort_session(model).run(None, feeds)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32), rtol=4e-3, atol=4e-3)
