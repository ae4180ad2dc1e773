"""A node of any com.raggedvit op with a required input left out or empty is refused at session creation by the op,
naming the input and the order it takes them in; one input too many is refused by ONNX's schema check, which can
only count (DESIGN.md section 3). The cases: fuzz.arity (also drawn by the CPU fuzz)."""

from __future__ import annotations

import pytest
from fuzz.arity import KINDS, OP_INPUTS, ArityCase, arity_model, draw_arity_case, run_arity_case

CASES = [
    ArityCase(-1, op, kind, position)
    for op, (names, required) in OP_INPUTS.items()
    for kind in KINDS
    for position in ([len(names)] if kind == "extra" else required)
]


def test_every_op_refuses_a_broken_input_count(ort_library):
    sessions: dict = {}
    outcomes = [(c.describe(), *run_arity_case(c, sessions)) for c in CASES]
    failed = [o for o in outcomes if o[1:] != ("rejected_session", None)]
    assert not failed, failed
    assert len(CASES) == 43 and not sessions  # no session was created


def test_the_refusal_names_the_input_and_the_order(ort_library):
    import onnxruntime as ort

    from raggedvit.runtime import session_options

    c = ArityCase(-1, "GatherLayerNorm", "missing", 2)
    with pytest.raises(Exception) as info:
        ort.InferenceSession(arity_model(c), session_options(log_severity=4), providers=["CPUExecutionProvider"])
    text = str(info.value)
    assert "GatherLayerNorm: required input 'Gamma' (input 2) is missing (the node gives 2 of the 7 inputs)" in text
    assert "in this order: X, Index, Gamma, Beta, Skip (optional), Bias (optional), CuSeqlens (optional)" in text


def test_the_fuzz_draws_every_op_and_kind():
    from fuzz.linear import draw_any

    cases = [draw_any(14, i) for i in range(10_000)]
    arity = [c for c in cases if isinstance(c, ArityCase)]
    assert len(arity) == 250 and all(c.index % 40 == 8 for c in arity)
    assert {(c.op, c.kind) for c in arity} == {(op, kind) for op in OP_INPUTS for kind in KINDS}
    assert draw_arity_case(14, 48) == draw_any(14, 48)  # a reported call replays alone
