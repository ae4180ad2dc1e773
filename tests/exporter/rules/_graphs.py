"""Small helpers of the rule tests: constant values and a run through ONNX's reference evaluator."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir


def const(name: str, array: np.ndarray) -> ir.Value:
    value = ir.Value(name=name, const_value=ir.tensor(array))
    value.shape, value.type = value.const_value.shape, ir.TensorType(value.const_value.dtype)
    return value


def run(model: ir.Model, feeds: dict[str, np.ndarray]) -> np.ndarray:
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(ir.serde.serialize_model(model)).run(None, feeds)[0]
