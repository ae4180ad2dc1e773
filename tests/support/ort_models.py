"""ONNX models with com.raggedvit::RaggedAttention / RaggedLinear / RaggedSelect / RaggedMerge / BiasGelu nodes (IR
10, opset 17 + com.raggedvit 1) and inputs."""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper

__all__ = [
    "DTYPES",
    "LINEAR_INPUTS",
    "MERGE_INPUTS",
    "MERGE_OUTPUTS",
    "NORM_INPUTS",
    "SELECT_OUTPUTS",
    "attention_model",
    "chained_model",
    "gelu_model",
    "linear_model",
    "merge_model",
    "model_bytes",
    "norm_model",
    "random_batch",
    "select_model",
    "to_numpy",
]

DTYPES = {
    torch.float32: TensorProto.FLOAT,
    torch.float16: TensorProto.FLOAT16,
    torch.bfloat16: TensorProto.BFLOAT16,
}
_CU = {torch.int32: TensorProto.INT32, torch.int64: TensorProto.INT64}


def model_bytes(graph: onnx.GraphProto) -> bytes:
    """The serialized model of `graph`: IR 10, opset 17 + com.raggedvit 1."""
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.raggedvit", 1)]
    )
    model.ir_version = 10
    return model.SerializeToString()


def _attn_node(qkv: str, cu: str, outs: list[str], num_heads: int, name: str, **attrs: float | int) -> onnx.NodeProto:
    return helper.make_node(
        "RaggedAttention", [qkv, cu], outs, name=name, domain="com.raggedvit", num_heads=num_heads, **attrs
    )


def attention_model(
    dtype: torch.dtype,
    cu_dtype: torch.dtype,
    num_heads: int | None,
    *,
    cls_attn: bool = True,
    qkv_elem: int | None = None,
    any_rank: bool = False,
    bias_elem: int | None = None,
    pos_elems: tuple[int | None, int | None] | None = None,
    key_bias_elem: int | None = None,
    **attrs: float | int,
) -> bytes:
    """One RaggedAttention node: qkv [T, W], cu_seqlens [B+1] (, bias [W]) (, pos_table [H, R], token_pos [T])
    (, key_bias [T]) -> out [T, W/3] (, cls_attn [T]).

    any_rank declares the inputs without a shape, so that bad ranks reach the op's own checks. bias_elem adds
    the optional third input `bias` of that element type (any shape, to test the op's checks). pos_elems =
    (pos_table element type, token_pos element type) adds inputs 3 and 4 (None: that one left empty); the
    attributes grid_h, grid_w, num_prefix go in **attrs. key_bias_elem adds input 5 `key_bias` of that element
    type (any shape; the inputs before it left empty when absent).
    """
    elem = DTYPES[dtype] if qkv_elem is None else qkv_elem
    outs = ["out", "cls_attn"] if cls_attn else ["out"]
    node_attrs = dict(attrs)
    if num_heads is not None:
        node_attrs["num_heads"] = num_heads
    ins = ["qkv", "cu_seqlens"] + (["bias"] if bias_elem is not None else [])
    pos_inputs = []
    if pos_elems is not None:
        ins = ins + [""] * (3 - len(ins))
        for name, pos_elem in zip(("pos_table", "token_pos"), pos_elems):
            ins.append(name if pos_elem is not None else "")
            if pos_elem is not None:
                pos_inputs.append(helper.make_tensor_value_info(name, pos_elem, None))
    if key_bias_elem is not None:
        ins = ins + [""] * (5 - len(ins)) + ["key_bias"]
        pos_inputs.append(helper.make_tensor_value_info("key_bias", key_bias_elem, None))
    node = helper.make_node("RaggedAttention", ins, outs, domain="com.raggedvit", **node_attrs)
    outputs = [helper.make_tensor_value_info("out", elem, None)]
    if cls_attn:
        outputs.append(helper.make_tensor_value_info("cls_attn", TensorProto.FLOAT, None))
    graph = helper.make_graph(
        [node],
        "ragged_attention",
        [
            helper.make_tensor_value_info("qkv", elem, None if any_rank else ["T", "W"]),
            helper.make_tensor_value_info("cu_seqlens", _CU[cu_dtype], None if any_rank else ["B1"]),
        ]
        + ([helper.make_tensor_value_info("bias", bias_elem, None)] if bias_elem is not None else [])
        + pos_inputs,
        outputs,
    )
    return model_bytes(graph)


LINEAR_INPUTS = ("X", "W", "Bias", "Residual", "CuSeqlens")  # RaggedLinear's input order


def linear_model(
    elem: int,
    *,
    bias: bool = False,
    residual: bool = False,
    cu_elem: int | None = None,
    activation: int | float | None = None,
    elems: dict[str, int] | None = None,
    any_rank: bool = False,
) -> bytes:
    """One RaggedLinear node: X [T, K], W [N, K] (, Bias [N]) (, Residual [T, N]) (, CuSeqlens [B+1] of cu_elem)
    -> Y [T, N], all float inputs of element type `elem` (ONNX TensorProto code).

    Absent optional inputs are empty names in the node. activation None leaves the attribute out (default 0).
    elems overrides the element type of single inputs (to test the op's checks); any_rank declares the inputs
    without a shape, so that bad ranks reach the op's own checks.
    """
    present = {"X": True, "W": True, "Bias": bias, "Residual": residual, "CuSeqlens": cu_elem is not None}
    types = {name: elem for name in LINEAR_INPUTS} | {"CuSeqlens": cu_elem or TensorProto.INT64} | (elems or {})
    declared = {"X": ["T", "K"], "W": ["N", "K"], "Bias": ["N"], "Residual": ["T", "N"], "CuSeqlens": ["B1"]}
    names = [n if present[n] else "" for n in LINEAR_INPUTS]
    while names and not names[-1]:
        names.pop()
    attrs = {} if activation is None else {"activation": activation}
    node = helper.make_node("RaggedLinear", names, ["Y"], domain="com.raggedvit", **attrs)
    inputs = [
        helper.make_tensor_value_info(n, types[n], None if any_rank else declared[n])
        for n in LINEAR_INPUTS
        if present[n]
    ]
    y = helper.make_tensor_value_info("Y", types["X"], None if any_rank else ["T", "N"])
    return model_bytes(helper.make_graph([node], "ragged_linear", inputs, [y]))


def gelu_model(elem: int, *, bias: bool = True, bias_elem: int | None = None, rank: int | None = 2) -> bytes:
    """One com.raggedvit::BiasGelu node: X (, Bias [N]) -> Y of X's shape, element type `elem` (bias_elem overrides
    the bias's, to test the op's checks). rank None declares X and Y without a shape (bad ranks reach the op)."""
    dims = None if rank is None else [f"d{i}" for i in range(rank - 1)] + ["N"]
    names = ["X", "Bias"] if bias else ["X"]
    node = helper.make_node("BiasGelu", names, ["Y"], domain="com.raggedvit")
    inputs = [helper.make_tensor_value_info("X", elem, dims)]
    if bias:
        inputs.append(helper.make_tensor_value_info("Bias", bias_elem or elem, None if rank is None else ["N"]))
    y = helper.make_tensor_value_info("Y", elem, dims)
    return model_bytes(helper.make_graph([node], "bias_gelu", inputs, [y]))


NORM_INPUTS = ("X", "Index", "Gamma", "Beta", "Skip", "Bias", "CuSeqlens")  # GatherLayerNorm's input order


def norm_model(
    elem: int,
    *,
    skip: bool = True,
    bias: bool = True,
    cu: int | None = None,
    epsilon: float | None = None,
    elems: dict[str, int] | None = None,
    shaped: bool = True,
) -> bytes:
    """One com.raggedvit::GatherLayerNorm node: X [T, D], Index [R] int64, Gamma, Beta [D] (, Skip [T, D], Bias [D],
    CuSeqlens [B1] of element type `cu`) -> Normed, Sum [R, D], element type `elem` (elems overrides an input's, to
    test the op's checks); shaped False declares the inputs without a shape (bad ranks reach the op). Absent
    optional inputs before a present one are empty names."""
    present = {"Skip": skip, "Bias": bias, "CuSeqlens": cu is not None}
    names = [n if present.get(n, True) else "" for n in NORM_INPUTS]
    while names[-1] == "":
        names.pop()
    attrs = {} if epsilon is None else {"epsilon": epsilon}
    node = helper.make_node("GatherLayerNorm", names, ["Normed", "Sum"], domain="com.raggedvit", **attrs)
    types = {n: elem for n in NORM_INPUTS} | {"Index": TensorProto.INT64, "CuSeqlens": cu} | (elems or {})
    dims = {"X": ["T", "D"], "Skip": ["T", "D"], "Index": ["R"], "Gamma": ["D"], "Beta": ["D"], "Bias": ["D"],
            "CuSeqlens": ["B1"]}  # fmt: skip
    inputs = [helper.make_tensor_value_info(n, types[n], dims[n] if shaped else None) for n in names if n]
    outputs = [helper.make_tensor_value_info(n, elem, ["R", "D"] if shaped else None) for n in ("Normed", "Sum")]
    return model_bytes(helper.make_graph([node], "gather_layer_norm", inputs, outputs))


EMBED_INPUTS = ("Images", "Weight", "Prefix", "Pos")  # PatchEmbed's input order


def embed_model(
    image_elem: int = TensorProto.FLOAT,
    *,
    patch: int | None = 16,
    elems: dict[str, int] | None = None,
    shaped: bool = True,
) -> bytes:
    """One com.raggedvit::PatchEmbed node: Images [B, C, H, W] (`image_elem`), Weight [K, N] float16, Prefix [P, N],
    Pos [S, N] float -> Out [B, S, N] float16 (elems overrides an input's type, patch None leaves the attribute out:
    to test the op's checks); shaped False declares the inputs without a shape (bad ranks reach the op)."""
    attrs = {} if patch is None else {"patch": patch}
    node = helper.make_node("PatchEmbed", list(EMBED_INPUTS), ["Out"], domain="com.raggedvit", **attrs)
    types = {"Images": image_elem, "Weight": TensorProto.FLOAT16, "Prefix": TensorProto.FLOAT,
             "Pos": TensorProto.FLOAT} | (elems or {})  # fmt: skip
    dims = {"Images": ["B", "C", "H", "W"], "Weight": ["K", "N"], "Prefix": ["P", "N"], "Pos": ["S", "N"]}
    inputs = [helper.make_tensor_value_info(n, types[n], dims[n] if shaped else None) for n in EMBED_INPUTS]
    outputs = [helper.make_tensor_value_info("Out", TensorProto.FLOAT16, ["B", "S", "N"] if shaped else None)]
    return model_bytes(helper.make_graph([node], "patch_embed", inputs, outputs))


SELECT_OUTPUTS = ("src", "cu_new", "seq_id", "pos", "k")  # RaggedSelect's output order


def select_model(
    attrs: dict[str, int | float], *, elems: dict[str, int] | None = None, any_rank: bool = False
) -> bytes:
    """One RaggedSelect node: scores [T] float, cu [B1] int64 -> src, cu_new, seq_id, pos, k (int64).

    attrs are written as given (width, bound, num_prefix, policy, keep, mass; ints and floats as typed, to test
    the op's checks); elems overrides an input's element type; any_rank declares the inputs without a shape."""
    types = {"scores": TensorProto.FLOAT, "cu": TensorProto.INT64} | (elems or {})
    declared = {"scores": ["T"], "cu": ["B1"]}
    node = helper.make_node("RaggedSelect", ["scores", "cu"], list(SELECT_OUTPUTS), domain="com.raggedvit", **attrs)
    inputs = [helper.make_tensor_value_info(n, types[n], None if any_rank else declared[n]) for n in declared]
    outputs = [helper.make_tensor_value_info(n, TensorProto.INT64, None) for n in SELECT_OUTPUTS]
    return model_bytes(helper.make_graph([node], "ragged_select", inputs, outputs))


MERGE_INPUTS = ("x", "qkv", "qkv_bias", "size", "cu", "skip", "skip_bias")  # RaggedMerge's input order
MERGE_OUTPUTS = ("x_out", "size_out", "cu_out", "src", "key_bias", "score")  # and its output order
_MERGE_OUTPUT_ELEMS = (None, TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT64, TensorProto.FLOAT,
                       TensorProto.FLOAT)  # fmt: skip


def merge_model(
    elem: int,
    attrs: dict[str, int | float],
    *,
    qkv_bias: bool = False,
    size: bool = False,
    skip: bool = False,
    skip_bias: bool = False,
    adds: bool = False,
    elems: dict[str, int] | None = None,
    any_rank: bool = False,
) -> bytes:
    """One RaggedMerge node: x [T, C], qkv [T, W] (, qkv_bias [W]) (, size [T] float), cu [B1] int64 (, skip [T, C])
    (, skip_bias [C]) -> x_out [R, C], size_out [R], cu_out [B1], src [R], key_bias [R], score [S], element type
    `elem` for x, qkv, qkv_bias, skip, skip_bias and x_out.

    attrs are written as given (num_heads, num_prefix, r, class_token; ints and floats as typed, to test the op's
    checks); absent optional inputs are empty names; elems overrides an input's element type; any_rank declares the
    inputs without a shape (bad ranks reach the op). adds: skip and skip_bias are graph inputs that two ONNX Adds
    join to x before the node (x + (skip + skip_bias): the graph the exporter's merge_residual fuses)."""
    present = {"qkv_bias": qkv_bias, "size": size, "skip": skip, "skip_bias": skip_bias}
    names = [n if present.get(n, True) else "" for n in MERGE_INPUTS]
    while not names[-1]:  # trailing absent inputs: left out
        names.pop()
    types = {n: elem for n in MERGE_INPUTS} | {"size": TensorProto.FLOAT, "cu": TensorProto.INT64} | (elems or {})
    declared = {"x": ["T", "C"], "qkv": ["T", "W"], "qkv_bias": ["W"], "size": ["T"], "cu": ["B1"], "skip": ["T", "C"],
                "skip_bias": ["C"]}  # fmt: skip
    inputs = [helper.make_tensor_value_info(n, types[n], None if any_rank else declared[n]) for n in names if n]
    nodes = []
    if adds:
        branch = "skip"
        if skip_bias:
            nodes.append(helper.make_node("Add", ["skip", "skip_bias"], ["branch"]))
            branch = "branch"
        nodes.append(helper.make_node("Add", ["x", branch], ["residual"]))
        names = ["residual", *names[1:5]]
    nodes.append(helper.make_node("RaggedMerge", names, list(MERGE_OUTPUTS), domain="com.raggedvit", **attrs))
    outputs = [
        helper.make_tensor_value_info(n, types["x"] if e is None else e, None)
        for n, e in zip(MERGE_OUTPUTS, _MERGE_OUTPUT_ELEMS)
    ]
    return model_bytes(helper.make_graph(nodes, "ragged_merge", inputs, outputs))


def chained_model(
    dtype: torch.dtype,
    cu_dtype: torch.dtype,
    num_heads: int,
    head_dim: int,
    weights: list[np.ndarray],
    *,
    cls_attn: bool = True,
) -> bytes:
    """qkv -> RaggedAttention -> Cast(float) -> MatMul(w_i float32 [H*D, 3*H*D]) -> Cast -> RaggedAttention ...

    len(weights)+1 attention ops (MatMul in float: ORT's CPU EP has no bfloat16 MatMul).
    Outputs: out (last op), cls_attn of the last op when requested.
    """
    elem = DTYPES[dtype]
    nodes, inits = [], []
    x = "qkv"
    n = len(weights) + 1
    for i in range(n):
        last = i == n - 1
        outs = [f"o{i}"] + (["cls_attn"] if (last and cls_attn) else [])
        nodes.append(_attn_node(x, "cu_seqlens", outs, num_heads, f"attn{i}"))
        if not last:
            w = weights[i].astype(np.float32)
            inits.append(helper.make_tensor(f"w{i}", TensorProto.FLOAT, list(w.shape), w.tobytes(), raw=True))
            nodes.append(helper.make_node("Cast", [f"o{i}"], [f"f{i}"], to=TensorProto.FLOAT))
            nodes.append(helper.make_node("MatMul", [f"f{i}", f"w{i}"], [f"m{i}"], name=f"mm{i}"))
            nodes.append(helper.make_node("Cast", [f"m{i}"], [f"x{i + 1}"], to=elem))
            x = f"x{i + 1}"
    nodes.append(helper.make_node("Identity", [f"o{n - 1}"], ["out"]))
    outputs = [helper.make_tensor_value_info("out", elem, ["T", num_heads * head_dim])]
    if cls_attn:
        outputs.append(helper.make_tensor_value_info("cls_attn", TensorProto.FLOAT, ["T"]))
    graph = helper.make_graph(
        nodes,
        "ragged_attention_chain",
        [
            helper.make_tensor_value_info("qkv", elem, ["T", 3 * num_heads * head_dim]),
            helper.make_tensor_value_info("cu_seqlens", _CU[cu_dtype], ["B1"]),
        ],
        outputs,
        initializer=inits,
    )
    return model_bytes(graph)


def random_batch(
    gen: torch.Generator,
    batch: int,
    max_len: int,
    num_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    cu_dtype: torch.dtype,
    *,
    allow_empty: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """qkv [T, 3*H*D] of dtype and cu_seqlens [batch+1] of random lengths in [0 or 1, max_len]."""
    lo = 0 if allow_empty else 1
    lens = torch.randint(lo, max_len + 1, (batch,), generator=gen)
    cu = torch.zeros(batch + 1, dtype=torch.int64)
    cu[1:] = lens.cumsum(0)
    T = int(cu[-1])
    qkv = torch.randn(T, 3 * num_heads * head_dim, generator=gen).to(dtype)
    return qkv, cu.to(cu_dtype)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """numpy view for ORT inputs (bfloat16 goes through its uint16 bits, as onnxruntime expects)."""
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(np.uint16)
    return t.contiguous().numpy()
