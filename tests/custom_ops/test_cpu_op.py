"""RaggedAttention on the CPU EP vs the float64 torch reference: dtypes, cu types, cls_attn, chains, edge cases."""

from __future__ import annotations

import math

import pytest
import torch
from onnx import TensorProto, helper

from raggedvit.kernels.reference import ragged_attention_reference
from raggedvit.runtime import create_session, run_with_iobinding
from tests.support.ort_models import DTYPES, attention_model, chained_model, random_batch
from tests.support.testing import assert_close

CU_DTYPES = (torch.int32, torch.int64)
DTYPES_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def run_op(model: bytes, qkv: torch.Tensor, cu: torch.Tensor, out_width: int, *, cls_attn: bool = True):
    sess = create_session(model, "cpu", intra_op_threads=2)
    out = torch.empty(qkv.shape[0], out_width, dtype=qkv.dtype)
    outputs = {"out": out}
    if cls_attn:
        outputs["cls_attn"] = torch.empty(qkv.shape[0], dtype=torch.float32)
    run_with_iobinding(sess, {"qkv": qkv, "cu_seqlens": cu}, outputs)
    return outputs


def reference(qkv: torch.Tensor, cu: torch.Tensor, heads: int, scale: float | None = None):
    out, cls = ragged_attention_reference(
        qkv, cu, heads, scale=scale, return_cls_attn=True, compute_dtype=torch.float64
    )
    return out, cls


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("cu_dtype", CU_DTYPES)
@pytest.mark.parametrize("with_cls", [True, False])
def test_one_node_matches_reference(ort_library, gen, dtype, cu_dtype, with_cls):
    H, D = 3, 32
    qkv, cu = random_batch(gen, 6, 40, H, D, dtype, cu_dtype)
    got = run_op(attention_model(dtype, cu_dtype, H, cls_attn=with_cls), qkv, cu, H * D, cls_attn=with_cls)
    out, cls = reference(qkv, cu, H)
    assert got["out"].dtype == dtype
    assert_close(got["out"], out.to(dtype), name="out")
    if with_cls:
        assert_close(got["cls_attn"], cls.float(), name="cls_attn")
        sums = torch.stack([got["cls_attn"][a:b].sum() for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()) if b > a])
        assert torch.allclose(sums, torch.ones_like(sums), atol=1e-5)


@pytest.mark.parametrize("D", [1, 7, 40, 80, 128, 200])
def test_any_head_dim_and_scale(ort_library, gen, D):
    H, scale = 2, 0.3
    qkv, cu = random_batch(gen, 3, 17, H, D, torch.float32, torch.int64)
    got = run_op(attention_model(torch.float32, torch.int64, H, scale=scale), qkv, cu, H * D)
    out, cls = reference(qkv, cu, H, scale=scale)
    assert_close(got["out"], out.float(), name="out")
    assert_close(got["cls_attn"], cls.float(), name="cls_attn")


def test_long_sequences_use_threads(ort_library, gen):
    H, D = 4, 64
    qkv, cu = random_batch(gen, 3, 300, H, D, torch.float16, torch.int32, allow_empty=False)
    got = run_op(attention_model(torch.float16, torch.int32, H, max_seqlen=300), qkv, cu, H * D)
    out, cls = reference(qkv, cu, H)
    assert_close(got["out"], out.half(), name="out")
    assert_close(got["cls_attn"], cls.float(), name="cls_attn")


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("with_cls", [True, False])
def test_chained_ops(ort_library, gen, dtype, with_cls):
    """attn -> MatMul -> attn -> MatMul -> attn: every op consumes the previous op's output."""
    H, D, n_ops = 2, 16, 3
    qkv, cu = random_batch(gen, 5, 24, H, D, dtype, torch.int64)
    ws = [torch.randn(H * D, 3 * H * D, generator=gen) / math.sqrt(H * D) for _ in range(n_ops - 1)]
    model = chained_model(dtype, torch.int64, H, D, [w.numpy() for w in ws], cls_attn=with_cls)
    got = run_op(model, qkv, cu, H * D, cls_attn=with_cls)
    x = qkv
    for i in range(n_ops):  # reference chain in the op's dtype, each op in float64
        out, cls = reference(x, cu, H)
        out = out.to(dtype)
        if i < n_ops - 1:
            x = (out.float() @ ws[i]).to(dtype)
    assert_close(got["out"], out, rtol=4 * DTYPES_TOL[dtype], name="chained out")
    if with_cls:
        assert_close(got["cls_attn"], cls.float(), rtol=4 * DTYPES_TOL[dtype], name="chained cls_attn")


def test_empty_batch_and_empty_sequences(ort_library):
    H, D = 2, 8
    model = attention_model(torch.float32, torch.int64, H)
    for cu_list in ([0], [0, 0, 0]):  # B = 0 with T = 0; B = 2 sequences of length 0
        qkv = torch.empty(0, 3 * H * D)
        sess = create_session(model, "cpu")
        out, cls = run_with_iobinding(sess, {"qkv": qkv, "cu_seqlens": torch.tensor(cu_list)}, output_device="cpu")
        assert out.shape() == [0, H * D] and cls.shape() == [0]
    qkv = torch.randn(5, 3 * H * D)
    cu = torch.tensor([0, 0, 3, 3, 5, 5])
    got = run_op(model, qkv, cu, H * D)
    out, cls = reference(qkv, cu, H)
    assert_close(got["out"], out.float(), name="out")
    assert_close(got["cls_attn"], cls.float(), name="cls_attn")


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("cu_dtype", CU_DTYPES)
def test_dead_rows_past_cu_are_zero(ort_library, gen, dtype, cu_dtype):
    """cu[B] < T (the capacity layout): live rows as the reference, zeros in the dead rows (NaN-poisoned
    outputs: nothing is left unwritten); the reference has the same contract."""
    H, D = 2, 16
    qkv = torch.randn(40, 3 * H * D, generator=gen).to(dtype)
    cu = torch.tensor([0, 6, 6, 23], dtype=cu_dtype)  # rows 23..39 dead
    sess = create_session(attention_model(dtype, cu_dtype, H), "cpu", intra_op_threads=2)
    outputs = {"out": torch.full((40, H * D), math.nan, dtype=dtype), "cls_attn": torch.full((40,), math.nan)}
    run_with_iobinding(sess, {"qkv": qkv, "cu_seqlens": cu}, outputs)
    out, cls = reference(qkv, cu, H)
    assert_close(outputs["out"], out.to(dtype), name="out")
    assert_close(outputs["cls_attn"], cls.float(), name="cls_attn")
    assert (outputs["out"][23:] == 0).all() and (outputs["cls_attn"][23:] == 0).all()


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("width", [96, "W"])
def test_output_type_and_shape_inference(ort_library, dtype, width):
    """out's inferred type is qkv's (ORT checks it against the declared type of y = Identity(out))."""
    elem = DTYPES[dtype]
    node = helper.make_node("RaggedAttention", ["qkv", "cu"], ["out"], domain="com.raggedvit", num_heads=4)
    ident = helper.make_node("Identity", ["out"], ["y"])
    out_width = 32 if width == 96 else None
    graph = helper.make_graph(
        [node, ident],
        "g",
        [
            helper.make_tensor_value_info("qkv", elem, ["T", width]),
            helper.make_tensor_value_info("cu", TensorProto.INT64, ["B1"]),
        ],
        [helper.make_tensor_value_info("y", elem, ["T", out_width])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.raggedvit", 1)]
    )
    model.ir_version = 10
    sess = create_session(model.SerializeToString(), "cpu")
    qkv = torch.randn(6, 96).to(dtype)
    (y,) = run_with_iobinding(sess, {"qkv": qkv, "cu": torch.tensor([0, 6])}, output_device="cpu")
    names = {torch.float32: "float", torch.float16: "float16", torch.bfloat16: "bfloat16"}
    assert y.shape() == [6, 32] and y.data_type() == f"tensor({names[dtype]})"


def test_output_shape_inference(ort_library):
    sess = create_session(attention_model(torch.float16, torch.int32, 4), "cpu")
    out = sess.get_outputs()[0]
    assert out.type == "tensor(float16)"
    assert sess.get_outputs()[1].type == "tensor(float)"
    assert set(DTYPES) == {torch.float32, torch.float16, torch.bfloat16}


def test_unknown_row_count_stays_symbolic(ort_library):
    """qkv rows unknown at load time (Reshape to [-1, W]): the output's row dim must be a symbol, not -1,
    or a later Reshape of a reduction of it fails ORT's shape inference ("incompatible shapes")."""
    import numpy as np
    import onnx

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4, 12])
    cu = helper.make_tensor_value_info("cu", TensorProto.INT32, ["b1"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [
        helper.make_node("Reshape", ["x", "s"], ["qkv"]),
        helper.make_node("RaggedAttention", ["qkv", "cu"], ["o"], domain="com.raggedvit", num_heads=1),
        helper.make_node("ReduceL2", ["o"], ["l"], axes=[1], keepdims=0),
        helper.make_node("Reshape", ["l", "s2"], ["y"]),
    ]
    inits = [onnx.numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("s", [-1, 12]), ("s2", [-1, 4]))]
    graph = helper.make_graph(nodes, "unknown_rows", [x, cu], [y], inits)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.raggedvit", 1)]
    )
    model.ir_version = 10
    sess = create_session(model.SerializeToString(), "cpu")
    xs = np.random.default_rng(0).standard_normal((2, 4, 12)).astype(np.float32)
    (out,) = sess.run(None, {"x": xs, "cu": np.array([0, 3, 8], np.int32)})
    assert out.shape == (2, 4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_bias_input(ort_library, gen, dtype):
    """Optional input 2 `bias` [3*H*D]: the result is attention of qkv + bias (summed in qkv's dtype)."""
    H, D = 3, 16
    qkv, cu = random_batch(gen, 4, 30, H, D, dtype, torch.int32)
    bias = torch.randn(3 * H * D, generator=gen).to(dtype)
    sess = create_session(attention_model(dtype, torch.int32, H, bias_elem=DTYPES[dtype]), "cpu", intra_op_threads=2)
    out = torch.empty(qkv.shape[0], H * D, dtype=dtype)
    cls = torch.empty(qkv.shape[0], dtype=torch.float32)
    run_with_iobinding(sess, {"qkv": qkv, "cu_seqlens": cu, "bias": bias}, {"out": out, "cls_attn": cls})
    ref_out, ref_cls = reference(qkv + bias, cu, H)
    assert_close(out, ref_out.to(dtype), rtol=DTYPES_TOL[dtype], name="out")
    assert_close(cls, ref_cls.float(), rtol=DTYPES_TOL[dtype], name="cls_attn")


def test_bad_bias_shape_is_a_named_error(ort_library, gen):
    import onnxruntime as ort

    qkv, cu = random_batch(gen, 2, 6, 2, 3, torch.float32, torch.int64)  # W = 18
    sess = create_session(attention_model(torch.float32, torch.int64, 2, bias_elem=DTYPES[torch.float32]), "cpu")
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.InvalidArgument, match=r"input 'bias' must be 1-D \[18\]"):
        sess.run(None, {"qkv": qkv.numpy(), "cu_seqlens": cu.numpy(), "bias": torch.zeros(10).numpy()})


def test_bias_of_another_type_is_rejected(ort_library):
    """qkv and bias share one type constraint: ORT refuses a float16 bias for float32 qkv at session creation."""
    with pytest.raises(Exception, match="type"):
        create_session(attention_model(torch.float32, torch.int64, 2, bias_elem=DTYPES[torch.float16]), "cpu")
