"""Fuzz cases of com.raggedvit::RaggedAttention on the CPU EP: drawing, the expected outcome, one run.

A case is a pure function of (seed, index) (`draw_case`), so a crash at one index can be replayed alone. It
covers the attributes (num_heads incl. values whose 3*num_heads overflows int64, scale incl. NaN/inf,
max_seqlen, wrong attribute types), qkv/bias/cu_seqlens element types, shapes and ranks, and cu_seqlens
values (valid, or broken in one of several ways), and the relative position bias: attributes grid_h, grid_w,
num_prefix (incl. negative, float and overflowing values), pos_table / token_pos present, absent or alone, of
wrong shapes and types, and token_pos values out of range (negative, past the grid, the dtype's extremes: valid,
they are class rows). `expected_error` is the op's contract written
independently of the C++ checks: a case it accepts must run and match the float64 torch reference, any
other case must fail with an ONNX Runtime error.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from onnx import TensorProto, helper

from fuzz.pos import draw_pos, pos_attr_error, pos_input_error, token_pos
from tests.support.ort_models import model_bytes

__all__ = [
    "CRAFTED_NUM_HEADS",
    "Case",
    "cpu_session",
    "draw_case",
    "expected_error",
    "quiet_run_options",
    "refusal_names",
    "refusal",
    "run_bound",
    "run_case",
]

INT64_MAX = 2**63 - 1
MAX_NUM_HEADS = INT64_MAX // 3  # the op's limit: 3*num_heads must fit int64
CRAFTED_NUM_HEADS = (
    0x5555555555555555,  # 3x wraps to -1: every width is a "multiple"
    0x5555555555555556,  # 3x wraps to 2
    0x2AAAAAAAAAAAAAAB,  # 3x wraps to INT64_MIN + 1
    2**62,
    INT64_MAX,
    -(2**63),
    MAX_NUM_HEADS,
    MAX_NUM_HEADS + 1,
    2**31,
    2**32 + 1,
    -1,
    0,
)
ELEM = {
    "float": TensorProto.FLOAT,
    "float16": TensorProto.FLOAT16,
    "bfloat16": TensorProto.BFLOAT16,
    "double": TensorProto.DOUBLE,
    "int32": TensorProto.INT32,
    "int64": TensorProto.INT64,
}
TORCH = {
    "float": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "double": torch.float64,
    "int32": torch.int32,
    "int64": torch.int64,
}
FLOATS = ("float", "float16", "bfloat16")
SCALES = (0.125, 0.3, -0.7, 1.0, 0.0, 1e-30)
CRAFTED_SCALES = (1e30, math.nan, math.inf, -math.inf, 2)  # 1e30 is valid (saturated softmax); 2 is an int
MAX_SEQLENS = (0, 3, 16, 64, 2**62, INT64_MAX)
CRAFTED_MAX_SEQLENS = (-1, -(2**63), 16.0)  # 16.0 is a float
BAD_CU = ("decreasing", "above_t", "negative", "first", "last", "empty", "rank2", "b0_rows", "dtype_max", "dtype_min")


@dataclass(frozen=True)
class Case:
    """One call: the node (attributes, types, declared shapes) and its inputs (shapes, cu_seqlens values)."""

    index: int
    qkv_elem: str
    cu_elem: str  # "float" makes the node match no registered kernel
    num_heads: int | float | None  # a float: wrong attribute type
    scale: float | int | None  # an int: wrong attribute type
    max_seqlen: int | float | None
    cls_attn: bool
    declared: bool  # inputs declared [T, W] / [B1] (else no shape: any rank reaches the op)
    bias_elem: str | None
    bias_shape: tuple[int, ...] | None
    qkv_shape: tuple[int, ...]
    cu: list  # nested list for a rank-2 cu_seqlens
    amplitude: float
    data_seed: int
    # relative position bias: attributes (None: absent), inputs (elem None: absent), token_pos values drawn from
    # data_seed with `token_pos_odd` of the rows set to out-of-range values
    grid_h: int | float | None = None
    grid_w: int | float | None = None
    num_prefix: int | float | None = None
    pos_table_elem: str | None = None
    pos_table_shape: tuple[int, ...] | None = None
    token_pos_elem: str | None = None
    token_pos_shape: tuple[int, ...] | None = None
    token_pos_odd: float = 0.0

    def describe(self) -> str:
        d = asdict(self)
        if isinstance(d["cu"], list) and len(d["cu"]) > 12:
            d["cu"] = d["cu"][:12] + ["..."]
        return ", ".join(f"{k}={v!r}" for k, v in d.items())


def _valid_cu(rng: random.Random, T: int, max_seqlen: int | float | None) -> list[int]:
    if T == 0 and rng.random() < 0.3:
        return [0]  # B = 0
    if isinstance(max_seqlen, int) and 0 < max_seqlen < T and rng.random() < 0.7:
        lens, left = [], T  # chunks within max_seqlen, some empty
        while left > 0:
            n = rng.randint(0, min(left, max_seqlen))
            lens.append(n)
            left -= n
        return [0, *np.cumsum(lens).tolist()]
    cuts = sorted(rng.randint(0, T) for _ in range(rng.randint(0, 7)))
    if cuts and rng.random() < 0.25:  # the capacity layout: rows cuts[-1]..T-1 are dead (cu[B] < T)
        return [0, *cuts]
    return [0, *cuts, T]


def _broken_cu(rng: random.Random, cu: list[int], T: int, kind: str, cu_elem: str) -> list:
    cu = list(cu)
    i = rng.randrange(len(cu))
    info = np.iinfo(np.int32 if cu_elem == "int32" else np.int64)
    if kind == "decreasing":
        hi = rng.randint(1, max(T, 1))
        return [0, hi, rng.randint(0, hi - 1), T]
    if kind == "above_t":
        cu[i] = T + rng.randint(1, 1 << 20)
    elif kind == "negative":
        cu[i] = -rng.randint(1, 1 << 20)
    elif kind == "first":
        cu[0] = rng.choice([1, -1, T + 1])
    elif kind == "last":
        cu[-1] = T + rng.choice([1, 5])
    elif kind == "empty":
        return []
    elif kind == "rank2":
        return [cu]
    elif kind == "b0_rows":
        return [0]
    elif kind == "dtype_max":
        cu[i] = int(info.max)
    else:
        cu[i] = int(info.min)
    return cu


def _pick(rng: random.Random, normal: tuple, crafted: tuple, cdf: tuple[float, float]):
    """None (absent) below cdf[0], a normal value below cdf[1], else a crafted one."""
    r = rng.random()
    return None if r < cdf[0] else rng.choice(normal) if r < cdf[1] else rng.choice(crafted)


def draw_case(seed: int, index: int) -> Case:
    """The case `index` of fuzz run `seed` (deterministic; no torch random state involved)."""
    rng = random.Random(f"raggedvit-fuzz:{seed}:{index}")
    qkv_elem = rng.choice(FLOATS) if rng.random() < 0.96 else rng.choice(("double", "int32"))
    cu_elem = rng.choice(("int32", "int64")) if rng.random() < 0.98 else "float"
    r = rng.random()
    if r < 0.8:
        heads = rng.choice((1, 1, 2, 3, 4, 6))
    elif r < 0.95:
        heads = rng.choice(CRAFTED_NUM_HEADS)
    else:
        heads = rng.choice((None, 2.0))
    scale = _pick(rng, SCALES, CRAFTED_SCALES, (0.55, 0.93))
    max_seqlen = _pick(rng, MAX_SEQLENS, CRAFTED_MAX_SEQLENS, (0.7, 0.95))
    T = 0 if rng.random() < 0.05 else (rng.randint(1, 40) if rng.random() < 0.85 else rng.randint(41, 257))
    if isinstance(heads, int) and 0 < heads <= 6:
        width = 3 * heads * rng.randint(1, 24)
    else:
        width = rng.choice((3, 6, 12, 24, 48, 96))
    shape_r = rng.random()
    if shape_r < 0.03:
        qkv_shape = (T * width,)
    elif shape_r < 0.06:
        qkv_shape = (2, T, width)
    elif shape_r < 0.10:
        qkv_shape = (T, rng.choice((0, width + 1, width + 3)))
    else:
        qkv_shape = (T, width)
    cu = _valid_cu(rng, T, max_seqlen)
    if rng.random() < 0.25:
        cu = _broken_cu(rng, cu, T, rng.choice(BAD_CU), cu_elem)
    bias_elem = bias_shape = None
    if rng.random() < 0.2:
        W = qkv_shape[-1]
        bias_elem, bias_shape = qkv_elem, (W,)
        if rng.random() < 0.25:
            if rng.random() < 0.5:
                bias_elem = rng.choice([e for e in FLOATS if e != qkv_elem])
            else:
                bias_shape = rng.choice([(W + 1,), (1, W), ()])
    case = Case(
        index=index,
        qkv_elem=qkv_elem,
        cu_elem=cu_elem,
        num_heads=heads,
        scale=scale,
        max_seqlen=max_seqlen,
        cls_attn=rng.random() < 0.6,
        declared=rng.random() < 0.3,
        bias_elem=bias_elem,
        bias_shape=bias_shape,
        qkv_shape=qkv_shape,
        cu=cu,
        amplitude=rng.choice((1.0, 1.0, 4.0)),
        data_seed=rng.getrandbits(62),
    )
    return draw_pos(rng, case) if rng.random() < 0.3 else case


def expected_error(c: Case) -> str | None:
    """Why the op must refuse `c`, as "<category>: <detail>" (None: it must run and match the reference)."""
    if c.qkv_elem not in FLOATS:
        return f"qkv type: {c.qkv_elem}"
    if c.cu_elem not in ("int32", "int64"):
        return f"cu_seqlens type: {c.cu_elem}"
    if not isinstance(c.num_heads, int) or not 1 <= c.num_heads <= MAX_NUM_HEADS:
        return f"num_heads: {c.num_heads!r}"
    if c.scale is not None and (not isinstance(c.scale, float) or not math.isfinite(c.scale)):
        return f"scale: {c.scale!r}"
    if c.max_seqlen is not None and (not isinstance(c.max_seqlen, int) or c.max_seqlen < 0):
        return f"max_seqlen: {c.max_seqlen!r}"
    if (err := pos_attr_error(c)) is not None:
        return err
    if c.cu_elem in ("int32", "int64") and c.token_pos_elem is not None and c.token_pos_elem != c.cu_elem:
        return f"token_pos: type {c.token_pos_elem} vs cu_seqlens {c.cu_elem}"  # no kernel for the node
    if c.pos_table_elem not in (None, "float"):
        return f"pos_table: type {c.pos_table_elem}"  # refused by the node's declared float
    if len(c.qkv_shape) != 2:
        return f"qkv rank: {len(c.qkv_shape)}"
    T, W = c.qkv_shape
    if W <= 0 or W % (3 * c.num_heads):
        return f"qkv width: {W} vs num_heads {c.num_heads}"
    if not c.cu or isinstance(c.cu[0], list):
        return f"cu_seqlens shape: {np.shape(c.cu)}"
    if len(c.cu) == 1 and T > 0:
        return f"cu_seqlens shape: B = 0 with T = {T}"
    if c.cu[0] != 0 or c.cu[-1] > T:  # cu[B] < T: rows past cu[B] are dead (zero outputs)
        return f"cu_seqlens values: ends {c.cu[0]}, {c.cu[-1]} vs T = {T}"
    for lo, hi in zip(c.cu[:-1], c.cu[1:]):
        if hi < lo or hi > T:
            return f"cu_seqlens values: step {lo} -> {hi} (T = {T})"
        if c.max_seqlen is not None and hi - lo > c.max_seqlen:
            return f"max_seqlen: length {hi - lo} above {c.max_seqlen}"
    if c.bias_elem is not None and (c.bias_elem != c.qkv_elem or c.bias_shape != (W,)):
        return f"bias: {c.bias_elem} {c.bias_shape} vs width {W}"
    return pos_input_error(c, T)


def build_model(c: Case) -> bytes:
    """One RaggedAttention node with the case's attributes and declared input types."""
    named = (("num_heads", c.num_heads), ("scale", c.scale), ("max_seqlen", c.max_seqlen), ("grid_h", c.grid_h),
             ("grid_w", c.grid_w), ("num_prefix", c.num_prefix))  # fmt: skip
    attrs = {k: v for k, v in named if v is not None}
    ins = ["qkv", "cu_seqlens"] + (["bias"] if c.bias_elem else [])
    if c.pos_table_elem or c.token_pos_elem:
        ins += [""] * (3 - len(ins)) + [
            "pos_table" if c.pos_table_elem else "",
            "token_pos" if c.token_pos_elem else "",
        ]
    outs = ["out", "cls_attn"] if c.cls_attn else ["out"]
    node = helper.make_node("RaggedAttention", ins, outs, domain="com.raggedvit", **attrs)
    cu_elem = TensorProto.FLOAT if c.cu_elem == "float" else ELEM[c.cu_elem]
    inputs = [
        helper.make_tensor_value_info("qkv", ELEM[c.qkv_elem], ["T", "W"] if c.declared else None),
        helper.make_tensor_value_info("cu_seqlens", cu_elem, ["B1"] if c.declared else None),
    ]
    if c.bias_elem:
        inputs.append(helper.make_tensor_value_info("bias", ELEM[c.bias_elem], None))
    for name, elem in (("pos_table", c.pos_table_elem), ("token_pos", c.token_pos_elem)):
        if elem:
            inputs.append(helper.make_tensor_value_info(name, ELEM[elem], None))
    outputs = [helper.make_tensor_value_info("out", ELEM[c.qkv_elem], None)]
    if c.cls_attn:
        outputs.append(helper.make_tensor_value_info("cls_attn", TensorProto.FLOAT, None))
    graph = helper.make_graph([node], "fuzz", inputs, outputs)
    return model_bytes(graph)


def _tensors(c: Case) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(c.data_seed)
    dtype = TORCH[c.qkv_elem]
    if dtype.is_floating_point:
        qkv = (torch.randn(c.qkv_shape, generator=gen, dtype=torch.float64) * c.amplitude).to(dtype)
    else:
        qkv = torch.randint(-8, 8, c.qkv_shape, generator=gen, dtype=dtype)
    cu_dtype = torch.float32 if c.cu_elem == "float" else TORCH[c.cu_elem]
    feeds = {"qkv": qkv, "cu_seqlens": torch.tensor(c.cu, dtype=cu_dtype)}
    if c.bias_elem:
        feeds["bias"] = (torch.randn(c.bias_shape, generator=gen, dtype=torch.float64) * 0.5).to(TORCH[c.bias_elem])
    if c.pos_table_elem:
        feeds["pos_table"] = (torch.randn(c.pos_table_shape, generator=gen, dtype=torch.float64) * 2).to(
            TORCH[c.pos_table_elem]
        )
    if c.token_pos_elem:
        feeds["token_pos"] = token_pos(c, gen)
    return feeds


def _check_outputs(c: Case, feeds: dict[str, torch.Tensor], outs: dict[str, torch.Tensor]) -> str | None:
    from raggedvit.kernels.reference import ragged_attention_reference
    from tests.support.testing import assert_close

    T, W = c.qkv_shape
    dtype = TORCH[c.qkv_elem]
    if tuple(outs["out"].shape) != (T, W // 3) or outs["out"].dtype != dtype:
        return f"out has shape {tuple(outs['out'].shape)} {outs['out'].dtype}, expected ({T}, {W // 3}) {dtype}"
    if T == 0 or (c.scale is not None and abs(c.scale) > 100):
        return None  # nothing to compare / saturated softmax: running without error is the check
    qkv = feeds["qkv"]
    if "bias" in feeds:  # rounded in qkv's type, as the op (and an ONNX Add) does
        qkv = (qkv.float() + feeds["bias"].float()).to(dtype)
    scale = None if c.scale is None else float(np.float32(c.scale))
    pos = {}
    if "pos_table" in feeds:
        pos = {"pos_table": feeds["pos_table"], "token_pos": feeds["token_pos"], "grid": (c.grid_h, c.grid_w),
               "num_prefix": c.num_prefix or 0}  # fmt: skip
    ref, ref_cls = ragged_attention_reference(
        qkv, feeds["cu_seqlens"], c.num_heads, scale=scale, return_cls_attn=True, compute_dtype=torch.float64, **pos
    )
    try:
        assert_close(outs["out"], ref.to(dtype), name="out")
        if c.cls_attn:
            assert_close(outs["cls_attn"], ref_cls.float(), name="cls_attn")
    except AssertionError as e:
        return str(e)
    return None


def run_case(c: Case, sessions: dict) -> tuple[str, str | None]:
    """Runs `c` (sessions: a cache the caller keeps); (outcome, failure text or None).

    Outcomes: "checked" (valid, ran and matched), "rejected_session" / "rejected_run" (invalid, refused by
    ORT at session creation / at run time), "failed" (anything else)."""
    from raggedvit.runtime import bind_tensor

    expected = expected_error(c)
    # repr: 2.0 == 2 as a dict key, but a float num_heads is a different node
    key = repr((c.qkv_elem, c.cu_elem, c.num_heads, c.scale, c.max_seqlen, c.cls_attn, c.declared, c.bias_elem,
                c.grid_h, c.grid_w, c.num_prefix, c.pos_table_elem, c.token_pos_elem))  # fmt: skip
    try:
        sess = cpu_session(sessions, key, lambda: build_model(c))
    except Exception as e:  # noqa: BLE001 - classified by refusal
        return refusal(e, expected, "session")
    feeds = _tensors(c)
    outs: dict[str, torch.Tensor] = {}
    if expected is None and c.qkv_shape[0] > 0:  # preallocated (numpy has no bfloat16 to read ORT's back)
        outs["out"] = torch.full((c.qkv_shape[0], c.qkv_shape[1] // 3), math.nan, dtype=TORCH[c.qkv_elem])
        if c.cls_attn:
            outs["cls_attn"] = torch.full((c.qkv_shape[0],), math.nan)
    binding = sess.io_binding()
    run_options = quiet_run_options()
    try:
        for name, value in feeds.items():
            bind_tensor(binding, name, value)
        for name in ("out", "cls_attn")[: 1 + c.cls_attn]:
            if name in outs:
                bind_tensor(binding, name, outs[name], output=True)
            else:
                binding.bind_output(name, "cpu")
        sess.run_with_iobinding(binding, run_options)
    except Exception as e:  # noqa: BLE001 - classified by refusal
        return refusal(e, expected, "run")
    if expected is not None:
        return "failed", f"invalid input accepted ({expected})"
    if not outs:  # T = 0: ORT allocated the empty outputs
        shapes = [v.shape() for v in binding.get_outputs()]
        want = [[0, c.qkv_shape[1] // 3], [0]][: 1 + c.cls_attn]
        return ("checked", None) if shapes == want else ("failed", f"empty outputs have shapes {shapes}, not {want}")
    err = _check_outputs(c, feeds, outs)
    return ("failed", err) if err else ("checked", None)


def cpu_session(sessions: dict, key: str, model: Callable[[], bytes]) -> Any:
    """The CPU-EP session of `key` from the cache `sessions`, created from model() on first use (quiet logging);
    raises what session creation raises (classify it with `refusal`)."""
    import onnxruntime as ort

    from raggedvit.runtime import session_options

    sess = sessions.get(key)
    if sess is None:
        so = session_options(intra_op_threads=1, log_severity=4)
        sess = sessions[key] = ort.InferenceSession(model(), so, providers=["CPUExecutionProvider"])
    return sess


def quiet_run_options() -> Any:
    """ORT RunOptions that log nothing below fatal (the fuzz's refusals are expected)."""
    import onnxruntime as ort

    run_options = ort.RunOptions()
    run_options.log_severity_level = 4
    return run_options


def run_bound(sess: Any, feeds: dict[str, torch.Tensor], outputs: tuple[str, ...]) -> list[np.ndarray]:
    """Runs `sess` on `feeds` bound by io binding (bind_tensor), the named outputs bound to the CPU, under
    quiet_run_options; returns the outputs as numpy arrays (ORT's exceptions propagate, for `refusal`)."""
    from raggedvit.runtime import bind_tensor

    binding = sess.io_binding()
    for name, value in feeds.items():
        bind_tensor(binding, name, value)
    for name in outputs:
        binding.bind_output(name, "cpu")
    sess.run_with_iobinding(binding, quiet_run_options())
    return binding.copy_outputs_to_cpu()


def refusal(e: Exception, expected: str | None, stage: str) -> tuple[str, str | None]:
    """The outcome of an exception at `stage` ("session" creation or "run"): "rejected_<stage>" for ORT's refusal
    of an invalid case that names the input or attribute at fault (refusal_names), "failed" for a valid case, a
    non-ORT error or a refusal that names none of them."""
    if expected is None:
        what = "session creation refused a valid node" if stage == "session" else "valid input refused"
        return "failed", f"{what}: {e}"
    if not _is_ort_error(e):
        return "failed", f"non-ORT error {e!r}"
    names = refusal_names(expected)
    text = " ".join(str(e).split())
    if _ORT_TYPE_CHECK in text:  # ORT's graph type inference (before any kernel): it names the node's output arg
        names = (*names, "output arg")
    named = any(f"'{n}'" in text or f"({n})" in text or f"{n} " in text for n in names)
    if not named and not any(f"'{n}'" in text or f"({n})" in text or f"input: {n} " in text for n in ARGUMENT_NAMES):
        return "failed", f"refusal of ({expected}) names none of {names} (nor another argument): {text[:400]}"
    return f"rejected_{stage}", None


# ORT refuses an optional input whose type differs from X's while inferring types: outputs of an UNDEFINED type take
# the last UNDEFINED input's, so its message names the output it would mistype, not the input
_ORT_TYPE_CHECK = "Type Error: Type (tensor("

# every input and attribute of the seven ops: a case with several faults may be refused for another one than the
# category names, as long as the refusal names it
ARGUMENT_NAMES = (
    "qkv", "cu_seqlens", "bias", "pos_table", "token_pos", "num_heads", "scale", "max_seqlen", "grid_h", "grid_w",
    "num_prefix", "X", "W", "Bias", "Residual", "CuSeqlens", "activation", "scores", "cu", "width", "bound",
    "policy", "keep", "mass", "Index", "Gamma", "Beta", "Skip", "epsilon", "Images", "Weight", "Prefix", "Pos",
    "patch", "x", "qkv_bias", "size", "skip", "skip_bias", "r", "class_token",
)  # fmt: skip

# categories whose refusal may name any of several attributes; other categories name theirs in their words
_NAMED = {
    "select attributes": ("width", "bound", "num_prefix", "policy"),
    "select fraction": ("keep", "mass"),
    "select huge width": ("width",),
    "pos attributes": ("grid_h", "grid_w", "num_prefix"),
    "merge attributes": ("num_heads", "r", "class_token"),
}
_OPS = ("linear", "norm", "embed", "gelu", "select", "merge")
_DESCRIPTORS = ("type", "rank", "shape", "values", "width")


def refusal_names(expected: str) -> tuple[str, ...]:
    """The inputs or attributes a refusal of the expected error "<category>: <detail>" must name: the category's
    words without the op and the descriptor ("linear X type" -> X, "cu_seqlens values" -> cu_seqlens)."""
    category = expected.split(":")[0].strip()
    if category in _NAMED:
        return _NAMED[category]
    words = category.split()
    if len(words) > 1 and words[0] in _OPS:
        words = words[1:]
    return tuple(w for w in words if w not in _DESCRIPTORS) or (category,)


def _is_ort_error(e: Exception) -> bool:
    """An error ONNX Runtime raised (its pybind exception types, or the RuntimeError of run_with_iobinding)."""
    if type(e).__module__.startswith("onnxruntime"):
        return True
    return type(e) is RuntimeError and str(e).startswith("Error in execution: ")
