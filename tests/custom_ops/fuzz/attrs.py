"""Crafted calls of all seven ops (CPU EP) that the random fuzz draws rarely: every attribute given as the other
numeric type (an int-typed float attribute, a float-typed int one), at the int64 / float limits, and tensors with a
zero dimension whose other dimensions multiply past 2**63. Each valid node must load; each invalid one must be
refused with an ORT error naming the attribute or the input.

    python3 -m fuzz.attrs        # (tests/custom_ops on sys.path) one JSON line per case, in a child of the test

The contract written here independently of the C++ (op_checks.h): ATTRS lists each attribute's type and range.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from onnx import TensorProto

from tests.support.ort_models import (
    attention_model,
    embed_model,
    gelu_model,
    linear_model,
    merge_model,
    norm_model,
    select_model,
)

__all__ = ["ATTRS", "CraftedCase", "crafted_cases", "run_crafted"]

I64_MAX, I64_MIN = 2**63 - 1, -(2**63)
F32_MAX = float(np.finfo(np.float32).max)
SELECT = {"width": 4, "bound": 4, "num_prefix": 1, "policy": 0, "keep": 0.5, "mass": 0.0}
MERGE = {"num_heads": 2, "num_prefix": 1, "r": 2, "class_token": 1}

# op -> attribute -> (type, valid(value)): the documented attributes of every op (BiasGelu has none)
ATTRS: dict[str, dict[str, tuple[type, Callable[[float], bool]]]] = {
    "RaggedAttention": {
        "num_heads": (int, lambda v: 1 <= v <= I64_MAX // 3),
        "scale": (float, math.isfinite),
        "max_seqlen": (int, lambda v: v >= 0),
        "grid_h": (int, lambda v: v >= 0),
        "grid_w": (int, lambda v: v >= 0),
        "num_prefix": (int, lambda v: v >= 0),
    },
    "RaggedLinear": {"activation": (int, lambda v: v in (0, 1))},
    "RaggedSelect": {
        "width": (int, lambda v: v >= SELECT["bound"]),  # bound (4) <= width
        "bound": (int, lambda v: 0 <= v <= SELECT["width"]),
        "num_prefix": (int, lambda v: v >= 0),
        "policy": (int, lambda v: v == 0),  # policy 1 needs mass in (0, 1]: mass is 0 here
        "keep": (float, lambda v: 0 < v <= 1),
        "mass": (float, lambda v: 0 <= v <= 1),
    },
    "GatherLayerNorm": {"epsilon": (float, lambda v: math.isfinite(v) and 0 <= v <= F32_MAX)},
    "PatchEmbed": {"patch": (int, lambda v: 1 <= v <= 1 << 15)},
    "RaggedMerge": {
        "num_heads": (int, lambda v: 1 <= v <= I64_MAX // 3),
        "num_prefix": (int, lambda v: v >= 0),
        "r": (int, lambda v: v >= 0),
        "class_token": (int, lambda v: v in (0, 1)),
    },
}
# a refusal may name the attribute a value conflicts with instead (bound > width; policy 1 without its mass)
RELATED = {("RaggedSelect", "width"): ("bound",), ("RaggedSelect", "bound"): ("width",),
           ("RaggedSelect", "policy"): ("mass", "keep")}  # fmt: skip
INT_VALUES = (0, 1, 2, -1, 2**31, 2**62, I64_MAX // 3, I64_MAX // 3 + 1, I64_MAX, I64_MIN)
FLOAT_VALUES = (0.0, 0.5, 1.0, 1.5, -0.1, 1e20, F32_MAX, -F32_MAX, math.inf, -math.inf, math.nan, 1e-45)


@dataclass(frozen=True)
class CraftedCase:
    op: str
    label: str
    names: tuple[str, ...]  # what a refusal must name (empty: the case is valid and must load)
    model: Callable[[], bytes]
    feeds: dict | None = None  # run-time inputs (sizes near 2**63): {name: array or (shape, dtype)}


def _model(op: str, name: str, value: float) -> bytes:
    if op == "RaggedAttention":
        attrs = {} if name == "num_heads" else {name: value}
        return attention_model(torch.float32, torch.int64, value if name == "num_heads" else 2, **attrs)
    if op == "RaggedLinear":
        return linear_model(TensorProto.FLOAT, activation=value)
    if op == "RaggedSelect":
        return select_model({**SELECT, name: value})
    if op == "GatherLayerNorm":
        return norm_model(TensorProto.FLOAT, epsilon=value)
    if op == "RaggedMerge":
        return merge_model(TensorProto.FLOAT, {**MERGE, name: value}, qkv_bias=True, size=True)
    return embed_model(patch=value)


def _embed_feeds(images: tuple) -> dict:
    return {"Images": images, "Weight": np.zeros((0, 4), np.float16), "Prefix": np.zeros((1, 4), np.float32),
            "Pos": np.zeros((2, 4), np.float32)}  # fmt: skip


def _size_cases() -> list[CraftedCase]:
    f32, big = np.float32, 0x6DB6DB6DB6DB6DB7  # big * 7 wraps int64 to 1
    return [
        CraftedCase("PatchEmbed", "grid wraps", ("Images",), lambda: embed_model(patch=1),
                    _embed_feeds(((1, 0, big, 7), f32))),
        CraftedCase("PatchEmbed", "B = 0, H near 2**62", ("Images",), lambda: embed_model(patch=1),
                    _embed_feeds(((0, 3, 2**62, 2), f32))),
        CraftedCase("RaggedAttention", "T = 0, W near 2**62", ("qkv",),
                    lambda: attention_model(torch.float32, torch.int64, 1, any_rank=True),
                    {"qkv": ((0, 3 * 2**61), f32), "cu_seqlens": np.array([0])}),
        CraftedCase("RaggedLinear", "T = 0, K near 2**62", ("X",),
                    lambda: linear_model(TensorProto.FLOAT, any_rank=True),
                    {"X": ((0, 2**62), f32), "W": ((0, 2**62), f32)}),
        CraftedCase("BiasGelu", "a zero dim, the others near 2**64", ("X",),
                    lambda: gelu_model(TensorProto.FLOAT, bias=False, rank=None), {"X": ((0, 2**62, 4), f32)}),
        CraftedCase("GatherLayerNorm", "T near 2**62, D = 0", ("X",),
                    lambda: norm_model(TensorProto.FLOAT, skip=False, bias=False, shaped=False),
                    {"X": ((2**62, 0), f32), "Index": np.zeros(0, np.int64), "Gamma": np.zeros(0, f32),
                     "Beta": np.zeros(0, f32)}),
        CraftedCase("RaggedSelect", "B * width near 2**63", ("width",),
                    lambda: select_model({**SELECT, "width": 2**62, "bound": 2**62}),
                    {"scores": np.zeros(4, f32), "cu": np.array([0, 2, 4])}),
    ]  # fmt: skip


def crafted_cases() -> list[CraftedCase]:
    """Every attribute of every op at each crafted value of its own type and of the other numeric type, then the
    size cases."""
    cases = []
    for op, attrs in ATTRS.items():
        for name, (kind, valid) in attrs.items():
            for value in INT_VALUES + FLOAT_VALUES:
                if kind is int and isinstance(value, float) and not math.isfinite(value):
                    continue  # a float-typed int attribute: one finite value of each kind is enough
                ok = isinstance(value, kind) and valid(value)
                label = f"{name}={value!r} ({type(value).__name__})"
                names = () if ok else (name, *RELATED.get((op, name), ()))
                cases.append(CraftedCase(op, label, names, lambda o=op, n=name, v=value: _model(o, n, v)))
    return cases + _size_cases()


def _ort_value(v):
    import onnxruntime as ort

    if isinstance(v, tuple):  # (shape, dtype): a tensor with a zero dim, allocated by ORT without data
        return ort.OrtValue.ortvalue_from_shape_and_type(list(v[0]), v[1], "cpu")
    return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(v))


def run_crafted(case: CraftedCase) -> dict:
    """{"case", "outcome": loaded | ran | refused | failed, "error"}: failed for a valid case refused, an invalid
    one accepted, a non-ORT error or a refusal that names none of case.names."""
    from raggedvit.runtime import create_session

    label = f"{case.op} {case.label}"
    try:
        sess = create_session(case.model(), "cpu")
        if case.feeds is not None:
            sess.run_with_ort_values(None, {k: _ort_value(v) for k, v in case.feeds.items()})
    except Exception as e:  # noqa: BLE001 - classified below
        text = " ".join(str(e).split())
        if not type(e).__module__.startswith("onnxruntime"):
            return {"case": label, "outcome": "failed", "error": f"non-ORT error {e!r}"}
        if not case.names:
            return {"case": label, "outcome": "failed", "error": f"valid node refused: {text}"}
        if not any(f"'{n}'" in text or f"{n} " in text or f"({n})" in text for n in case.names):
            return {"case": label, "outcome": "failed", "error": f"refusal names none of {case.names}: {text}"}
        return {"case": label, "outcome": "refused", "error": text[:300]}
    if case.names:
        return {"case": label, "outcome": "failed", "error": f"invalid node accepted (should name {case.names})"}
    return {"case": label, "outcome": "ran" if case.feeds is not None else "loaded", "error": None}


def main() -> None:
    import onnxruntime as ort

    ort.set_default_logger_severity(4)
    for case in crafted_cases():
        print(json.dumps(run_crafted(case)), flush=True)  # one line per case: a crash is pinned to the next one


if __name__ == "__main__":
    sys.exit(main())
