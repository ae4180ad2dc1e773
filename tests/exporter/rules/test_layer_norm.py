"""The LayerNormalization rules (raggedvit/exporter/rules/layer_norm.py) on hand-built graphs."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from raggedvit.exporter.rules import fuse_for_ort

from ._graphs import const as _const


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
        # the residual Add stays (fused into the GEMM by ONNX Runtime; layer_norm.py says why it is not absorbed)
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

    from ..conftest import to_proto

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


def _skip_norm_model(*, bias: bool, cast: bool, residual_first: bool, T: int = 5, C: int = 24) -> ir.Model:
    """LayerNormalization(Add(r, B)) with B = Add(y, b), Cast(Add(y, b), float) (y float16) or y (no bias); r, y
    [T, C] inputs; outputs: the normalised rows and the sum (the next residual)."""
    f32, f16 = ir.DataType.FLOAT, ir.DataType.FLOAT16
    ydt = f16 if cast else f32
    r = ir.Value(name="r", shape=ir.Shape([T, C]), type=ir.TensorType(f32))
    y = ir.Value(name="y", shape=ir.Shape([T, C]), type=ir.TensorType(ydt))
    gamma = _const("gamma", np.linspace(0.5, 1.5, C).astype(np.float32))
    beta = _const("beta", np.linspace(-1, 1, C).astype(np.float32))
    nodes, inits, branch = [], [gamma, beta], y
    if bias:
        b = _const("b", np.linspace(-0.3, 0.3, C).astype(ydt.numpy()))
        add_b = ir.node("Add", [y, b])
        nodes, inits, branch = [add_b], [*inits, b], add_b.outputs[0]
        branch.shape, branch.type = y.shape, y.type
    if cast:
        to = ir.node("Cast", [branch], {"to": f32})
        to.outputs[0].shape, to.outputs[0].type = y.shape, r.type
        nodes, branch = [*nodes, to], to.outputs[0]
    add = ir.node("Add", [r, branch] if residual_first else [branch, r])
    add.outputs[0].name, add.outputs[0].shape, add.outputs[0].type = "s", r.shape, r.type
    ln = ir.node("LayerNormalization", [add.outputs[0], gamma, beta], {"axis": -1, "epsilon": 1e-6})
    ln.outputs[0].name, ln.outputs[0].shape, ln.outputs[0].type = "n", r.shape, r.type
    graph = ir.Graph([r, y], [ln.outputs[0], add.outputs[0]], nodes=[*nodes, add, ln], initializers=inits,
                     opset_imports={"": 20})  # fmt: skip
    return ir.Model(graph, ir_version=10)


@pytest.mark.parametrize(
    ("bias", "cast", "residual_first", "rule", "ops"),
    [
        (True, False, True, "skip_layer_norm", ["SkipLayerNormalization"]),
        (True, False, False, "skip_layer_norm", ["SkipLayerNormalization"]),
        (True, True, True, "skip_layer_norm_cast", ["Cast", "SkipLayerNormalization"]),  # bias added in float32
        (False, False, True, "skip_layer_norm_plain", ["SkipLayerNormalization"]),
    ],
)
def test_skip_layer_norm_rules(ort_session, bias, cast, residual_first, rule, ops):
    from onnxscript.rewriter import rewrite

    from raggedvit.exporter.rules.layer_norm import PlainSkipLayerNorm, SkipLayerNorm

    kw = {"bias": bias, "cast": cast, "residual_first": residual_first}
    rules = {
        "skip_layer_norm": SkipLayerNorm.rule(rule, cast=False, residual_first=residual_first),
        "skip_layer_norm_cast": SkipLayerNorm.rule(rule, cast=True, residual_first=residual_first),
        "skip_layer_norm_plain": PlainSkipLayerNorm.rule(rule),
    }
    gen = np.random.default_rng(5)
    feeds = {"r": gen.standard_normal((5, 24)).astype(np.float32)}
    feeds["y"] = gen.standard_normal((5, 24)).astype(np.float16 if cast else np.float32)
    want = ort_session(_skip_norm_model(**kw)).run(None, feeds)
    model = rewrite(_skip_norm_model(**kw), pattern_rewrite_rules=[rules[rule]])
    assert [n.op_type for n in model.graph] == ops
    node = model.graph.node(-1)
    assert node.domain == "com.microsoft" and len(node.inputs) == (5 if bias else 4)
    got = ort_session(model).run(None, feeds)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_skip_layer_norm_rule_needs_constant_weights():
    """A LayerNormalization whose gamma is a graph input is not fused (SkipLayerNormalization wants constants)."""
    from onnxscript.rewriter import rewrite

    from raggedvit.exporter.rules.layer_norm import SkipLayerNorm

    model = _skip_norm_model(bias=True, cast=False, residual_first=True)
    gamma = model.graph.initializers.pop("gamma")
    gamma.const_value = None
    model.graph.inputs.append(gamma)
    model = rewrite(model, pattern_rewrite_rules=[SkipLayerNorm.rule("s", cast=False, residual_first=True)])
    assert [n.op_type for n in model.graph] == ["Add", "Add", "LayerNormalization"]
