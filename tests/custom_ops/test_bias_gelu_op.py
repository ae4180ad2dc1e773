"""com.raggedvit::BiasGelu: CPU EP vs a float64 reference, error statuses, and the CUDA EP (GPU only)."""

from __future__ import annotations

import math

import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto

from raggedvit.runtime import create_session
from tests.support.ort_models import gelu_model
from tests.support.testing import gelu_float64

ELEM = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16}


def reference(x: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """GELU(X + Bias) in float64."""
    s = x.astype(np.float64) + (0.0 if bias is None else bias.astype(np.float64))
    return gelu_float64(torch.from_numpy(s)).numpy()


def run(model: bytes, feeds: dict[str, np.ndarray], device: str = "cpu") -> np.ndarray:
    (y,) = create_session(model, device, intra_op_threads=2).run(None, feeds)
    return y


def within_rounding(y: np.ndarray, ref: np.ndarray, dtype) -> bool:
    """|y - ref| <= half an ulp of y's dtype + 1e-5 relative of float32 math + half a subnormal spacing."""
    fi = np.finfo(dtype)
    bound = (0.5 * float(fi.eps) + 1e-5) * np.abs(ref) + 0.5 * float(fi.tiny) * float(fi.eps)
    return bool((np.abs(y.astype(np.float64) - ref) <= bound).all())


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(37, 48), (2, 3, 16), (40,), (0, 16)], ids=str)
def test_cpu_matches_reference(ort_library, dtype, bias, shape):
    rng = np.random.default_rng(3)
    feeds = {"X": (3 * rng.standard_normal(shape)).astype(dtype)}
    if bias:
        feeds["Bias"] = rng.standard_normal(shape[-1]).astype(dtype)
    y = run(gelu_model(ELEM[dtype], bias=bias, rank=len(shape)), feeds)
    assert y.dtype == np.dtype(dtype) and y.shape == shape
    assert within_rounding(y, reference(feeds["X"], feeds.get("Bias")), dtype)


def test_cpu_special_values(ort_library):
    x = np.array([[math.inf, -math.inf, math.nan, -40.0, 40.0, 0.0, -0.0, 1e-30] * 2], dtype=np.float32)
    y = run(gelu_model(TensorProto.FLOAT, bias=False), {"X": x})[0, :8]
    assert y[0] == math.inf and math.isnan(y[2]) and y[3] == 0.0 and y[4] == 40.0 and y[5] == 0.0
    assert y[7] == pytest.approx(5e-31)


@pytest.mark.parametrize(
    ("model", "feeds", "message"),
    [
        (gelu_model(TensorProto.FLOAT, rank=None), {"X": np.array(1.0, np.float32), "Bias": np.zeros(1, np.float32)},
         "input 'X' must have rank >= 1"),
        (gelu_model(TensorProto.FLOAT, rank=None), {"X": np.zeros((2, 4), np.float32), "Bias": np.zeros(5, np.float32)},
         r"input 'Bias' must be 1-D \[N\] = \[4\] \(X shape \[2, 4\]\), got shape \[5\]"),
        (gelu_model(TensorProto.FLOAT, rank=None, bias_elem=TensorProto.FLOAT16),
         {"X": np.zeros((2, 4), np.float32), "Bias": np.zeros(4, np.float16)}, "has element type float16"),
        (gelu_model(TensorProto.DOUBLE, rank=None), {"X": np.zeros((2, 4)), "Bias": np.zeros(4)},
         "the CPU EP supports float and float16"),
    ],
    ids=["scalar", "bias_shape", "bias_type", "double"],
)  # fmt: skip
def test_cpu_errors_are_statuses(ort_library, model, feeds, message):
    with pytest.raises((ort.capi.onnxruntime_pybind11_state.Fail, ort.capi.onnxruntime_pybind11_state.InvalidArgument,
                        ort.capi.onnxruntime_pybind11_state.RuntimeException), match=message):  # fmt: skip
        run(model, feeds)


@pytest.mark.gpu
@pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(), reason="needs onnxruntime-gpu")
@pytest.mark.parametrize("shape", [(197, 3072), (1030, 1536), (3, 5, 48)], ids=str)
@pytest.mark.parametrize("bias", [False, True])
def test_cuda_matches_reference(ort_library, shape, bias):
    rng = np.random.default_rng(5)
    feeds = {"X": (3 * rng.standard_normal(shape)).astype(np.float16)}
    if bias:
        feeds["Bias"] = rng.standard_normal(shape[-1]).astype(np.float16)
    model = gelu_model(TensorProto.FLOAT16, bias=bias, rank=len(shape))
    sess = create_session(model, "cuda")
    assert any(p.startswith("CUDA") for p in sess.get_providers())
    (y,) = sess.run(None, feeds)
    assert within_rounding(y, reference(feeds["X"], feeds.get("Bias")), np.float16)


@pytest.mark.gpu
@pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(), reason="needs onnxruntime-gpu")
def test_cuda_width_not_multiple_of_16_is_a_status(ort_library):
    model = gelu_model(TensorProto.FLOAT16, bias=True)
    with pytest.raises(Exception, match="must be a multiple of 16"):
        create_session(model, "cuda").run(None, {"X": np.zeros((3, 20), np.float16), "Bias": np.zeros(20, np.float16)})
