"""Fuzz cases of every op's input count (calls with index % ARITY_EVERY == ARITY_AT of `fuzz.linear.draw_any`, taken
from RaggedAttention's calls): a valid node of one of the seven ops with a required input left out (the node's inputs
end before it), given as "" (an empty name in its place), or with one input more than the op declares.

A missing or empty required input must be refused at session creation by the op itself, naming the input (every
com.raggedvit input is declared optional so that ONNX's schema check lets it through, custom_ops/op_checks.h
MissingInputError). An input past the declared count is refused by ONNX's schema check before any op code runs
(onnx/defs/schema.cc, OpSchema::Verify: "has input size N not in range [min=0, max=M]"), which cannot name it
(DESIGN.md section 3): the case expects that text.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import onnx
import torch
from onnx import TensorProto

from fuzz.cases import cpu_session

__all__ = ["ARITY_AT", "ARITY_EVERY", "ArityCase", "OP_INPUTS", "arity_expected_error", "draw_arity_case",
           "run_arity_case"]  # fmt: skip

ARITY_EVERY, ARITY_AT = 40, 8  # i % 10 == 8: a RaggedAttention index (never RaggedLinear, Select, Gelu, Norm, Embed)
EXTRA_INPUT_TEXT = "has input size"  # ONNX's schema check of the input count (it names no input)
KINDS = ("missing", "empty", "extra")

_SELECT = {"width": 4, "bound": 4, "num_prefix": 1, "policy": 0, "keep": 0.5, "mass": 0.0}
_MERGE = {"num_heads": 2, "num_prefix": 1, "r": 2, "class_token": 1}


def _builders() -> dict[str, Callable[[], bytes]]:
    from tests.support.ort_models import (
        attention_model,
        embed_model,
        gelu_model,
        linear_model,
        merge_model,
        norm_model,
        select_model,
    )

    return {
        "RaggedAttention": lambda: attention_model(torch.float32, torch.int64, 2),
        "RaggedLinear": lambda: linear_model(TensorProto.FLOAT, bias=True, residual=True, cu_elem=TensorProto.INT64),
        "RaggedSelect": lambda: select_model(_SELECT),
        "BiasGelu": lambda: gelu_model(TensorProto.FLOAT),
        "GatherLayerNorm": lambda: norm_model(TensorProto.FLOAT, cu=TensorProto.INT64),
        "PatchEmbed": lambda: embed_model(),
        "RaggedMerge": lambda: merge_model(TensorProto.FLOAT, _MERGE, qkv_bias=True, size=True),
    }


# op -> (its inputs in order, the positions of the required ones): the op's contract, written apart from the C++
OP_INPUTS = {
    "RaggedAttention": (("qkv", "cu_seqlens", "bias", "pos_table", "token_pos", "key_bias"), (0, 1)),
    "RaggedLinear": (("X", "W", "Bias", "Residual", "CuSeqlens"), (0, 1)),
    "RaggedSelect": (("scores", "cu"), (0, 1)),
    "BiasGelu": (("X", "Bias"), (0,)),
    "GatherLayerNorm": (("X", "Index", "Gamma", "Beta", "Skip", "Bias", "CuSeqlens"), (0, 1, 2, 3)),
    "PatchEmbed": (("Images", "Weight", "Prefix", "Pos"), (0, 1, 2, 3)),
    "RaggedMerge": (("x", "qkv", "qkv_bias", "size", "cu", "skip", "skip_bias"), (0, 1, 4)),
}


@dataclass(frozen=True)
class ArityCase:
    index: int
    op: str
    kind: str  # "missing": the node's inputs end before input `position`; "empty": it is ""; "extra": one more
    position: int  # the required input left out (missing, empty); the extra input's position (extra)

    def describe(self) -> str:
        return f"{self.op} input count: {self.kind} input {self.position}"


def draw_arity_case(seed: int, index: int) -> ArityCase:
    """The arity case `index` of fuzz run `seed` (deterministic)."""
    rng = random.Random(f"raggedvit-fuzz-arity:{seed}:{index}")
    op = rng.choice(sorted(OP_INPUTS))
    names, required = OP_INPUTS[op]
    kind = rng.choice(KINDS)
    position = len(names) if kind == "extra" else rng.choice(required)
    return ArityCase(index, op, kind, position)


def arity_expected_error(c: ArityCase) -> str:
    """Every arity case is refused: "arity <kind>: <what the refusal must say>"."""
    if c.kind == "extra":
        return f"arity extra: {EXTRA_INPUT_TEXT}"
    return f"arity {c.kind}: '{OP_INPUTS[c.op][0][c.position]}'"


def arity_model(c: ArityCase) -> bytes:
    """The op's valid node (every input it declares that the builder gives) with the case's change; graph inputs the
    node no longer reads are dropped, an extra one is declared like the node's first."""
    model = onnx.load_from_string(_builders()[c.op]())
    graph = model.graph
    node = graph.node[0]
    names = list(node.input)
    if c.kind == "missing":
        names = names[: c.position]
    elif c.kind == "empty":
        names[c.position] = ""
    else:
        declared = len(OP_INPUTS[c.op][0])
        names = names + [""] * (declared - len(names)) + ["extra"]
        first = next(v for v in graph.input if v.name == names[0])
        extra = onnx.ValueInfoProto()
        extra.CopyFrom(first)
        extra.name = "extra"
        graph.input.append(extra)
    del node.input[:]
    node.input.extend(names)
    kept = [v for v in graph.input if v.name in names]
    del graph.input[:]
    graph.input.extend(kept)
    return model.SerializeToString()


def run_arity_case(c: ArityCase, sessions: dict) -> tuple[str, str | None]:
    """Creates the session; ("rejected_session", None) when it is refused with the expected text, else ("failed",
    why)."""
    expected = arity_expected_error(c)
    try:
        cpu_session(sessions, repr(("arity", c.op, c.kind, c.position)), lambda: arity_model(c))
    except Exception as e:  # noqa: BLE001 - every ORT refusal is checked below
        text = " ".join(str(e).split())
        if not type(e).__module__.startswith("onnxruntime"):
            return "failed", f"non-ORT error {e!r}"
        want = expected.split(": ", 1)[1]
        if want not in text or (c.kind != "extra" and f"{c.op}: required input" not in text):
            return "failed", f"refusal of ({expected}) does not say {want!r} in the op's words: {text[:400]}"
        return "rejected_session", None
    return "failed", f"a node with its input count broken ({c.kind} input {c.position}) was accepted"
