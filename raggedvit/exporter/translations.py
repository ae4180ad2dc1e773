"""ONNX translations of the torch ops PrunedViT calls that torch.onnx has none (or no exact one) for.

`torch.ops.raggedvit.ragged_attention` -> `com.raggedvit::RaggedAttention` (DESIGN.md section 3),
`torch.ops.raggedvit.ragged_linear` -> `com.raggedvit::RaggedLinear`,
`torch.ops.raggedvit.select_rows` -> `com.raggedvit::RaggedSelect` (a pruning stage's indices),
`torch.ops.raggedvit.merge_tokens` -> `com.raggedvit::RaggedMerge` (a tome stage's whole merge), and
`aten.sort` -> ONNX TopK over the whole axis: ONNX TopK orders equal values by ascending index, which is the
stable sort PrunedViT asks for (ties: the lower position first).
"""

from __future__ import annotations

from collections.abc import Callable

import onnx
import onnxscript
import torch
from onnx.defs import OpSchema
from onnxscript import opset18 as op

import raggedvit.kernels  # noqa: F401  (registers torch.ops.raggedvit.ragged_attention / ragged_linear)
import raggedvit.pruning.merge_op  # noqa: F401  (registers torch.ops.raggedvit.merge_tokens)
import raggedvit.pruning.select_op  # noqa: F401  (registers torch.ops.raggedvit.select_rows)
from raggedvit.exporter.metadata import RAGGED_DOMAIN

__all__ = [
    "RAGGED_ATTENTION_SCHEMA",
    "RAGGED_LINEAR_SCHEMA",
    "RAGGED_MERGE_SCHEMA",
    "RAGGED_SELECT_SCHEMA",
    "TRANSLATIONS",
    "merge_tokens",
    "ragged_attention",
    "ragged_linear",
    "select_rows",
    "sort",
]

_P = OpSchema.FormalParameter
_OPTIONAL = OpSchema.FormalParameterOption.Optional
RAGGED_ATTENTION_SCHEMA = OpSchema(
    "RaggedAttention",
    RAGGED_DOMAIN,
    1,
    inputs=[
        _P("qkv", "T"),
        _P("cu_seqlens", "I"),
        _P("bias", "T", param_option=_OPTIONAL),
        _P("pos_table", "F", param_option=_OPTIONAL),
        _P("token_pos", "I", param_option=_OPTIONAL),
        _P("key_bias", "F", param_option=_OPTIONAL),
    ],
    outputs=[_P("out", "T"), _P("cls_attn", "F", param_option=_OPTIONAL)],
    type_constraints=[
        ("T", ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"], "qkv, bias and out"),
        ("I", ["tensor(int32)", "tensor(int64)"], "cu_seqlens and token_pos"),
        ("F", ["tensor(float)"], "pos_table, key_bias and cls_attn"),
    ],
    attributes=[
        OpSchema.Attribute("num_heads", OpSchema.AttrType.INT, "H", required=True),
        OpSchema.Attribute("scale", OpSchema.AttrType.FLOAT, "softmax scale (default 1/sqrt(D))", required=False),
        OpSchema.Attribute("max_seqlen", OpSchema.AttrType.INT, "hint, unused by the kernels", required=False),
        OpSchema.Attribute("grid_h", OpSchema.AttrType.INT, "patch grid rows (with pos_table)", required=False),
        OpSchema.Attribute("grid_w", OpSchema.AttrType.INT, "patch grid columns (with pos_table)", required=False),
        OpSchema.Attribute("num_prefix", OpSchema.AttrType.INT, "prefix tokens (with pos_table)", required=False),
    ],
)
RAGGED_LINEAR_SCHEMA = OpSchema(
    "RaggedLinear",
    RAGGED_DOMAIN,
    1,
    inputs=[
        _P("X", "T"),
        _P("W", "T"),
        _P("Bias", "T", param_option=_OPTIONAL),
        _P("Residual", "T", param_option=_OPTIONAL),
        _P("CuSeqlens", "I", param_option=_OPTIONAL),
    ],
    outputs=[_P("Y", "T")],
    type_constraints=[
        ("T", ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"], "X [T, K], W [N, K], Bias, Residual, Y"),
        ("I", ["tensor(int32)", "tensor(int64)"], "CuSeqlens [B+1]"),
    ],
    attributes=[OpSchema.Attribute("activation", OpSchema.AttrType.INT, "0 none, 1 GELU (erf)", required=False)],
)
_I64 = [("I", ["tensor(int64)"], "cu and every output")]
RAGGED_SELECT_SCHEMA = OpSchema(
    "RaggedSelect",
    RAGGED_DOMAIN,
    1,
    inputs=[_P("scores", "F"), _P("cu", "I")],
    outputs=[_P("src", "I"), _P("cu_new", "I"), _P("seq_id", "I"), _P("pos", "I"), _P("k", "I")],
    type_constraints=[("F", ["tensor(float)"], "scores [T]"), *_I64],
    attributes=[
        OpSchema.Attribute("width", OpSchema.AttrType.INT, "rows per image before the stage (bound)", required=True),
        OpSchema.Attribute("bound", OpSchema.AttrType.INT, "output rows per image", required=True),
        OpSchema.Attribute("num_prefix", OpSchema.AttrType.INT, "prefix rows per image", required=False),
        OpSchema.Attribute("policy", OpSchema.AttrType.INT, "0 count (keep), 1 cls mass (mass)", required=False),
        OpSchema.Attribute("keep", OpSchema.AttrType.FLOAT, "kept fraction (count)", required=False),
        OpSchema.Attribute("mass", OpSchema.AttrType.FLOAT, "kept cls mass (mass)", required=False),
    ],
)
RAGGED_MERGE_SCHEMA = OpSchema(
    "RaggedMerge",
    RAGGED_DOMAIN,
    1,
    inputs=[
        _P("x", "T"),
        _P("qkv", "T"),
        _P("qkv_bias", "T", param_option=_OPTIONAL),
        _P("size", "F", param_option=_OPTIONAL),
        _P("cu", "I"),
        _P("skip", "T", param_option=_OPTIONAL),
        _P("skip_bias", "T", param_option=_OPTIONAL),
    ],
    outputs=[
        _P("x_out", "T"),
        _P("size_out", "F"),
        _P("cu_out", "I"),
        _P("src", "I"),
        _P("key_bias", "F"),
        _P("score", "F"),
    ],
    type_constraints=[
        (
            "T",
            ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"],
            "x [T, C], qkv [T, 3HD], qkv_bias, skip [T, C], skip_bias [C], x_out",
        ),
        ("F", ["tensor(float)"], "size [T], size_out, key_bias [B*m], score [B*n_A]"),
        ("I", ["tensor(int64)"], "cu [B+1], cu_out, src [B*m]"),
    ],
    attributes=[
        OpSchema.Attribute("num_heads", OpSchema.AttrType.INT, "H: keys averaged over heads", required=True),
        OpSchema.Attribute("num_prefix", OpSchema.AttrType.INT, "prefix rows per image (never merged)", required=True),
        OpSchema.Attribute("r", OpSchema.AttrType.INT, "rows to merge per image (min(r, (n - p) // 2))", required=True),
        OpSchema.Attribute("class_token", OpSchema.AttrType.INT, "1: unmerged rows in position order", required=True),
    ],
)
_EMPTY_F32 = onnx.helper.make_tensor("empty", onnx.TensorProto.FLOAT, [0], [])
_RAGGED = onnxscript.values.Opset(RAGGED_DOMAIN, 1)
_RAGGED_ATTENTION = onnxscript.values.Op(_RAGGED, "RaggedAttention", RAGGED_ATTENTION_SCHEMA)
_RAGGED_LINEAR = onnxscript.values.Op(_RAGGED, "RaggedLinear", RAGGED_LINEAR_SCHEMA)
_RAGGED_SELECT = onnxscript.values.Op(_RAGGED, "RaggedSelect", RAGGED_SELECT_SCHEMA)
_RAGGED_MERGE = onnxscript.values.Op(_RAGGED, "RaggedMerge", RAGGED_MERGE_SCHEMA)


def ragged_attention(
    qkv,
    cu_seqlens,
    bias=None,
    num_heads: int = 1,
    scale: float = 1.0,
    return_cls_attn=False,
    pos_table=None,
    token_pos=None,
    grid_h: int = 0,
    grid_w: int = 0,
    num_prefix: int = 0,
    key_bias=None,
):
    """raggedvit::ragged_attention(qkv [T, 3HD], cu [B+1], bias [3HD]?, ..., pos_table [H, R]?, token_pos [T]?,
    grid_h, grid_w, num_prefix, key_bias [T]?) -> (out [T, HD], cls_attn [T] or [0]).

    Without pos_table and key_bias the node is what it always was (2 or 3 inputs, no grid attributes); with
    pos_table, inputs 3 and 4 (bias left empty when absent) and the attributes grid_h, grid_w, num_prefix; with
    key_bias, input 5 (the inputs before it left empty when absent)."""
    inputs = [qkv, cu_seqlens] + ([bias] if bias is not None else [])
    attrs = {"num_heads": int(num_heads), "scale": float(scale)}
    if pos_table is not None or key_bias is not None:
        inputs = [qkv, cu_seqlens, bias, pos_table, token_pos]
    if pos_table is not None:
        attrs.update(grid_h=int(grid_h), grid_w=int(grid_w), num_prefix=int(num_prefix))
    if key_bias is not None:
        inputs.append(key_bias)
    if return_cls_attn:
        out, cls_attn = _RAGGED_ATTENTION(*inputs, **attrs, _outputs=2)
        return out, cls_attn
    out = _RAGGED_ATTENTION(*inputs, **attrs, _outputs=1)
    if isinstance(out, (tuple, list)):
        out = out[0]
    return out, op.Constant(value=_EMPTY_F32)  # the unrequested cls_attn: [0], unused


def ragged_linear(x, weight, bias=None, residual=None, cu_seqlens=None, activation: int = 0):
    """raggedvit::ragged_linear(x [T, K], weight [N, K], bias [N]?, residual [T, N]?, cu [B+1]?, activation)
    -> RaggedLinear(X, W, Bias, Residual, CuSeqlens) -> Y [T, N]: absent optional inputs are empty names, the
    int attribute `activation` is always written."""
    return _RAGGED_LINEAR(x, weight, bias, residual, cu_seqlens, activation=int(activation))


def select_rows(scores, cu, width: int, bound: int, num_prefix: int, policy: int, keep: float = 0.0, mass: float = 0.0):
    """raggedvit::select_rows(scores [T], cu [B+1], width, bound, num_prefix, policy, keep, mass) ->
    RaggedSelect(scores, cu) -> (src, cu_new, seq_id, pos [B*bound] / [B+1], k [B]); every attribute written."""
    attrs = {"width": int(width), "bound": int(bound), "num_prefix": int(num_prefix), "policy": int(policy)}
    return _RAGGED_SELECT(scores, cu, **attrs, keep=float(keep), mass=float(mass), _outputs=5)


def merge_tokens(x, qkv, qkv_bias, size, cu, num_heads: int, num_prefix: int, r: int, class_token: bool):
    """raggedvit::merge_tokens(x [T, C], qkv [T, 3HD], qkv_bias [3HD]?, size [T]?, cu [B+1], num_heads, num_prefix,
    r, class_token) -> RaggedMerge(x, qkv, qkv_bias, size, cu) -> (x_out, size_out, cu_out, src, key_bias, score);
    absent optional inputs are empty names, every attribute written."""
    attrs = {"num_heads": int(num_heads), "num_prefix": int(num_prefix), "r": int(r), "class_token": int(class_token)}
    return _RAGGED_MERGE(x, qkv, qkv_bias, size, cu, **attrs, _outputs=6)


def sort(self, stable=None, dim: int = -1, descending: bool = False):
    """aten.sort(.stable) -> TopK(k = the axis length, sorted): ties in ascending index order (stable)."""
    shape = self.shape
    rank = len(shape) if shape is not None else None
    axis = dim if dim >= 0 or rank is None else dim + rank
    size = shape[axis] if shape is not None else None
    if isinstance(size, int):
        k = op.Constant(value_ints=[size])
    else:
        k = op.Shape(self, start=axis, end=axis + 1)
    values, indices = op.TopK(self, k, axis=axis, largest=1 if descending else 0, sorted=1)
    return values, indices


def _sort_default(self, dim: int = -1, descending: bool = False):
    return sort(self, None, dim, descending)


def _sort_stable(self, *, stable=None, dim: int = -1, descending: bool = False):
    return sort(self, stable, dim, descending)


TRANSLATIONS: dict[Callable, Callable] = {
    torch.ops.raggedvit.ragged_attention.default: ragged_attention,
    torch.ops.raggedvit.ragged_linear.default: ragged_linear,
    torch.ops.raggedvit.select_rows.default: select_rows,
    torch.ops.raggedvit.merge_tokens.default: merge_tokens,
    torch.ops.aten.sort.default: _sort_default,
    torch.ops.aten.sort.stable: _sort_stable,
}
