"""com.raggedvit::RaggedViTBlock on the CPU EP: one-node models, random valid and invalid calls (the fuzz cases),
and the check of one call against vit_block_reference. `python -m` / `run_cases` runs a batch in a child process."""

from __future__ import annotations

import json
import math
import random
import sys
from dataclasses import dataclass, field

import numpy as np
import torch
from onnx import TensorProto, helper

from raggedvit.exporter.translations import VIT_BLOCK_INPUTS
from raggedvit.kernels.reference import BlockWeights, vit_block_reference

NAMES = tuple(s.rstrip("?") for s in VIT_BLOCK_INPUTS)
OPTIONAL = {s.rstrip("?") for s in VIT_BLOCK_INPUTS if s.endswith("?")}
STREAM = {"x", "norm1_weight", "norm1_bias", "norm2_weight", "norm2_bias", "ls1", "ls2"}
ELEM = {"float": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "double": TensorProto.DOUBLE,
        "int32": TensorProto.INT32, "int64": TensorProto.INT64}  # fmt: skip
NP = {"float": np.float32, "float16": np.float16, "double": np.float64, "int32": np.int32, "int64": np.int64}


def shapes(T: int, C: int, F: int, B: int) -> dict[str, tuple[int, ...]]:
    """The valid shape of every input."""
    return {
        "x": (T, C), "cu_seqlens": (B + 1,), "norm1_weight": (C,), "norm1_bias": (C,), "qkv_weight": (3 * C, C),
        "qkv_bias": (3 * C,), "proj_weight": (C, C), "proj_bias": (C,), "norm2_weight": (C,), "norm2_bias": (C,),
        "fc1_weight": (F, C), "fc1_bias": (F,), "fc2_weight": (C, F), "fc2_bias": (C,), "ls1": (C,), "ls2": (C,),
    }  # fmt: skip


def block_model(elems: dict[str, str], attrs: dict, *, cls_attn: bool = True) -> bytes:
    """One RaggedViTBlock node whose inputs (the keys of `elems`, of those element types; absent optional ones
    left empty) are graph inputs of any shape; outputs y (and cls_attn)."""
    inputs = [helper.make_tensor_value_info(n, ELEM[elems[n]], None) for n in NAMES if n in elems]
    outs = ["y", "cls_attn"] if cls_attn else ["y"]
    node = helper.make_node(
        "RaggedViTBlock", [n if n in elems else "" for n in NAMES], outs, domain="com.raggedvit", **attrs
    )
    outputs = [helper.make_tensor_value_info("y", ELEM[elems["x"]] if elems["x"] in ELEM else 0, None)]
    if cls_attn:
        outputs.append(helper.make_tensor_value_info("cls_attn", TensorProto.FLOAT, None))
    graph = helper.make_graph([node], "block", inputs, outputs)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.raggedvit", 1)]
    )
    model.ir_version = 10
    return model.SerializeToString()


def session(model: bytes, library: str):
    import onnxruntime as ort

    ort.set_default_logger_severity(4)  # the refusals are expected: no error lines on stderr
    opts = ort.SessionOptions()
    opts.register_custom_ops_library(library)
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 4
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def random_feeds(rng: np.random.Generator, T: int, C: int, F: int, lengths: list[int], stream: str, gemm: str,
                 present: set[str]) -> dict[str, np.ndarray]:  # fmt: skip
    """Valid inputs: cu of `lengths` (rows past their sum dead), weights of O(1/sqrt(fan-in)) scale."""
    feeds = {}
    for name, shape in shapes(T, C, F, len(lengths)).items():
        if name not in present:
            continue
        if name == "cu_seqlens":
            feeds[name] = np.array([0, *np.cumsum(lengths)], dtype=np.int64)
            continue
        scale = 1.0 / math.sqrt(shape[-1]) if name.endswith("weight") and len(shape) == 2 else 1.0
        base = 1.0 if name in ("norm1_weight", "norm2_weight") else 0.0
        values = base + (scale if len(shape) == 2 else 0.3) * rng.standard_normal(shape)
        feeds[name] = values.astype(NP[stream if name in STREAM else gemm])
    return feeds


def reference(feeds: dict[str, np.ndarray], num_heads: int, eps: float, scale: float, *, gold: bool = True):
    """(y, cls_attn) of vit_block_reference for numpy feeds: in float64 (gold), else with its roundings (float32
    arithmetic, rounded to the float16 inputs' types where the op stores: what a float16 call must match)."""
    t = {k: torch.from_numpy(v) for k, v in feeds.items()}
    w = BlockWeights(*(t.get(n) for n in NAMES[2:]))
    y, cls = vit_block_reference(
        t["x"], t["cu_seqlens"], w, num_heads, eps=eps, scale=scale, return_cls_attn=True,
        compute_dtype=torch.float64 if gold else None,
    )  # fmt: skip
    return y.double(), cls.double()


def close(got: np.ndarray, want: torch.Tensor, half: bool) -> bool:
    """Within 1e-5 (fp32, of the gold reference) or 4e-3 (any float16 input, of the rounding reference) of the
    largest |want| (at least 1)."""
    want = want.numpy()
    if got.shape != want.shape:
        return False
    tol = (4e-3 if half else 1e-5) * max(1.0, float(np.abs(want).max(initial=0.0)))
    return bool(np.all(np.abs(got.astype(np.float64) - want) <= tol))


@dataclass
class Case:
    """One fuzz call: shapes, dtypes, attributes, the inputs left out, and at most one breakage."""

    T: int
    C: int
    F: int
    lengths: list[int]
    heads: int
    stream: str
    gemm: str
    cu_elem: str
    attrs: dict
    present: set[str]
    breakage: str = ""  # "" valid, else what is broken (the expected refusal)
    mutate: dict = field(default_factory=dict)  # name -> (shape or None, elem or None)
    cu_values: list[int] | None = None


BREAKAGES = ("attr", "shape", "elem", "cu_values", "missing", "heads", "overflow")


def draw_case(seed: int, i: int) -> Case:
    rng = random.Random(seed * 1_000_003 + i)
    heads = rng.choice([1, 2, 3, 4])
    C = heads * rng.choice([1, 2, 4, 8, 16])
    F = rng.choice([1, 3, 8, 4 * C])
    lengths = [rng.randint(0, 9) for _ in range(rng.randint(1, 3))]
    T = sum(lengths) + rng.choice([0, 0, 1, 3])
    if T == 0:
        lengths, T = [1], 1
    stream, gemm = rng.choice([("float", "float"), ("float", "float16"), ("float16", "float16")])
    eps = rng.choice([1e-6, 1e-5, 0.0 if C >= 4 else 1e-6])
    attrs = {"num_heads": heads, "epsilon": eps, "scale": rng.choice([0.5, 1 / math.sqrt(C // heads), 0.0])}
    present = {n for n in NAMES if n not in OPTIONAL or rng.random() < 0.7}
    case = Case(T, C, F, lengths, heads, stream, gemm, rng.choice(["int32", "int64"]), attrs, present)
    if rng.random() < 0.4:
        return case
    kind = rng.choice(BREAKAGES)
    case.breakage = kind
    if kind == "attr":
        which = rng.choice(["num_heads_missing", "num_heads_float", "num_heads_neg", "eps_int", "eps_inf", "eps_neg",
                            "scale_missing", "scale_nan", "huge_heads"])  # fmt: skip
        a = case.attrs
        if which == "num_heads_missing":
            del a["num_heads"]
        elif which == "num_heads_float":
            a["num_heads"] = float(heads)
        elif which == "num_heads_neg":
            a["num_heads"] = rng.choice([0, -1, -(2**63)])
        elif which == "eps_int":
            a["epsilon"] = 1
        elif which == "eps_inf":
            a["epsilon"] = float("inf")
        elif which == "eps_neg":
            a["epsilon"] = -1.0
        elif which == "scale_missing":
            del a["scale"]
        elif which == "scale_nan":
            a["scale"] = float("nan")
        else:
            a["num_heads"] = 2**62
        case.breakage = f"attr:{which}"
    elif kind == "shape":
        name = rng.choice([n for n in NAMES if n in present and n != "cu_seqlens"])  # cu: the cu_values kind
        good = shapes(T, C, F, len(lengths))[name]
        bad = rng.choice([(), (*good, 1), tuple(d + rng.choice([1, -1]) for d in good)])
        if bad == good or any(d < 0 for d in bad):
            bad = (*good, 2)
        case.mutate[name] = (bad, None)
        case.breakage = f"shape:{name}"
    elif kind == "elem":
        name = rng.choice([n for n in NAMES if n in present and n != "cu_seqlens"])
        own = stream if name in STREAM else gemm
        case.mutate[name] = (None, rng.choice(["double", "int32", "float16" if own == "float" else "float"]))
        case.breakage = f"elem:{name}"
    elif kind == "cu_values":
        cu = [0, *np.cumsum(lengths).tolist()]
        j = rng.randrange(len(cu))
        cu[j] = rng.choice([-1, T + 1, 2**31 - 1, cu[j] - 1 if j else 1])
        if cu[0] == 0 and all(a <= b for a, b in zip(cu, cu[1:])) and cu[-1] <= T:  # still valid: other lengths
            case.lengths = [b - a for a, b in zip(cu, cu[1:])]
            case.breakage = ""
        else:
            case.cu_values = cu
            case.breakage = "cu_values"
    elif kind == "missing":
        case.present.discard(rng.choice([n for n in NAMES if n not in OPTIONAL and n not in ("x", "cu_seqlens")]))
    elif kind == "heads":  # num_heads not dividing C
        case.attrs["num_heads"] = C + 1
    else:  # no rows, but sizes whose element counts overflow int64 bytes
        big = rng.choice([2**60, 2**40, 2**33])  # 3C*C overflows (numpy allocates no [0, >= 2**61] float array)
        case.mutate["x"] = ((0, big), None)
        case.mutate["fc1_weight"] = ((0, big), None)
        case.cu_values = [0]
    return case


def run_case(case: Case, library: str) -> str:
    """'checked' (valid, equal to the reference), 'refused' (invalid, an ORT error), or 'FAIL: ...'."""
    rng = np.random.default_rng(abs(hash((case.T, case.C, case.F))) % 2**32)
    feeds = random_feeds(rng, case.T, case.C, case.F, case.lengths, case.stream, case.gemm, case.present)
    feeds["cu_seqlens"] = feeds["cu_seqlens"].astype(NP[case.cu_elem])
    if case.cu_values is not None:
        feeds["cu_seqlens"] = np.array(case.cu_values).astype(NP[case.cu_elem])
    for name, (shape, elem) in case.mutate.items():
        if shape is not None:
            feeds[name] = np.full(shape, 0.5, dtype=feeds[name].dtype)
        if elem is not None:
            feeds[name] = feeds[name].astype(NP[elem])
    elems = {n: _elem_name(feeds[n].dtype) for n in feeds}
    half = "float16" in (case.stream, case.gemm)
    try:
        sess = session(block_model(elems, case.attrs), library)
        y, cls = sess.run(None, feeds)
    except Exception as e:  # noqa: BLE001 (ORT raises its own exception types)
        if not case.breakage:
            return f"FAIL: valid case refused: {str(e)[:300]}"
        return "refused"
    if case.breakage:
        return f"FAIL: invalid case ({case.breakage}) accepted"
    gold_y, gold_cls = reference(feeds, case.heads, case.attrs["epsilon"], case.attrs["scale"], gold=not half)
    if not (close(y, gold_y, half) and close(cls, gold_cls, half)):
        return f"FAIL: output differs from the reference (max |dy| {np.abs(y - gold_y.numpy()).max():.3g})"
    return "checked"


def _elem_name(dtype: np.dtype) -> str:
    return {np.dtype(v): k for k, v in NP.items()}[np.dtype(dtype)]


def run_cases(seed: int, start: int, stop: int, library: str) -> dict[str, int]:
    """Outcome counts of cases [start, stop) (failures listed by index)."""
    counts: dict[str, int] = {}
    for i in range(start, stop):
        out = run_case(draw_case(seed, i), library)
        key = out if not out.startswith("FAIL") else f"{out} (case {i})"
        counts[key] = counts.get(key, 0) + 1
    return counts


if __name__ == "__main__":
    seed, start, stop, library = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    print(json.dumps(run_cases(seed, start, stop, library)))
