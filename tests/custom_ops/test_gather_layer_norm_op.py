"""com.raggedvit::GatherLayerNorm: CPU EP vs the float64 reference (raggedvit.kernels.gather_layer_norm), the live
count (CuSeqlens: zeros past it on the CPU EP), error statuses, and the CUDA EP (GPU only)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto

from raggedvit.kernels.gather_layer_norm import gather_layer_norm_reference
from raggedvit.runtime import create_session
from tests.support.ort_models import norm_model

ELEM = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16}
ERRORS = (ort.capi.onnxruntime_pybind11_state.Fail, ort.capi.onnxruntime_pybind11_state.InvalidArgument,
          ort.capi.onnxruntime_pybind11_state.RuntimeException)  # fmt: skip


def feeds_for(dtype, T=40, R=33, D=96, skip=True, bias=True, seed=3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    f = {"X": (2 * rng.standard_normal((T, D)) + 0.5).astype(dtype), "Index": rng.integers(-T, T, R),
         "Gamma": (rng.random(D) + 0.5).astype(dtype), "Beta": rng.standard_normal(D).astype(dtype)}  # fmt: skip
    if skip:
        f["Skip"] = rng.standard_normal((T, D)).astype(dtype)
    if bias:
        f["Bias"] = rng.standard_normal(D).astype(dtype)
    if R >= 2:
        f["Index"][0], f["Index"][1] = T, -T - 1  # out of range: zero rows
    return f


def reference(f: dict[str, np.ndarray], eps: float) -> tuple[np.ndarray, np.ndarray]:
    t = {k: torch.from_numpy(v) for k, v in f.items()}
    n, s = gather_layer_norm_reference(t["X"], t["Index"], t["Gamma"], t["Beta"], t.get("Skip"), t.get("Bias"), eps,
                                       t.get("CuSeqlens"), compute_dtype=torch.float64)  # fmt: skip
    return n.numpy(), s.numpy()


CU_ELEM = {np.int32: TensorProto.INT32, np.int64: TensorProto.INT64}


def run(model: bytes, feeds: dict[str, np.ndarray], device: str = "cpu") -> list[np.ndarray]:
    return create_session(model, device, intra_op_threads=2).run(None, feeds)


def assert_within_rounding(got: np.ndarray, want: np.ndarray, dtype, D: int) -> None:
    """|got - want| <= (half an ulp of dtype + D * 2^-24 of float32 sums) * (|want| + 1)."""
    bound = (0.5 * float(np.finfo(dtype).eps) + D * 2.0**-24) * (np.abs(want) + 1.0)
    assert bool((np.abs(got.astype(np.float64) - want) <= bound).all()), float(np.abs(got - want).max())


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize(("skip", "bias"), [(True, True), (True, False), (False, True), (False, False)])
@pytest.mark.parametrize(("T", "R", "D"), [(40, 33, 96), (7, 1, 16), (5, 0, 32), (30, 50, 300)], ids=str)
def test_cpu_matches_reference(ort_library, dtype, skip, bias, T, R, D):
    f = feeds_for(dtype, T, R, D, skip, bias)
    n, s = run(norm_model(ELEM[dtype], skip=skip, bias=bias, epsilon=1e-6), f)
    assert n.dtype == s.dtype == np.dtype(dtype) and n.shape == s.shape == (R, D)
    rn, rs = reference(f, 1e-6)
    assert_within_rounding(n, rn, dtype, D)
    assert_within_rounding(s, rs, dtype, D)
    if R >= 2:
        assert not n[:2].any() and not s[:2].any()


@pytest.mark.parametrize("cu_dtype", [np.int32, np.int64], ids=["int32", "int64"])
@pytest.mark.parametrize(("skip", "bias"), [(True, True), (False, False), (False, True)])
@pytest.mark.parametrize("last", [0, 1, 17, 33, 40, -3, "max"])
def test_cpu_live_rows(ort_library, cu_dtype, skip, bias, last):
    """Rows below live = clamp(CuSeqlens[B], 0, R) equal the reference; the CPU EP writes zeros past it."""
    R = 33
    f = feeds_for(np.float16, 40, R, 96, skip, bias)
    last = int(np.iinfo(cu_dtype).max) if last == "max" else last
    f["CuSeqlens"] = np.array([0, 7, 20, last], dtype=cu_dtype)  # B = 3; only CuSeqlens[B] is read
    live = min(max(last, 0), R)
    n, s = run(norm_model(TensorProto.FLOAT16, skip=skip, bias=bias, cu=CU_ELEM[cu_dtype], epsilon=1e-6), f)
    assert n.shape == s.shape == (R, 96)
    rn, rs = reference(f, 1e-6)
    assert not rn[live:].any() and not rs[live:].any()  # the reference's dead rows are zero too
    assert_within_rounding(n, rn, np.float16, 96)
    assert_within_rounding(s, rs, np.float16, 96)
    assert not n[live:].any() and not s[live:].any()
    # the live rows are the function without CuSeqlens
    n_all, s_all = run(norm_model(TensorProto.FLOAT16, skip=skip, bias=bias, epsilon=1e-6),
                       {k: v for k, v in f.items() if k != "CuSeqlens"})  # fmt: skip
    np.testing.assert_array_equal(n[:live], n_all[:live])
    np.testing.assert_array_equal(s[:live], s_all[:live])


def test_cpu_live_rows_b0(ort_library):
    """CuSeqlens [1] (B = 0): live = clamp(CuSeqlens[0], 0, R)."""
    f = feeds_for(np.float32, 12, 10, 16) | {"CuSeqlens": np.array([6], np.int64)}
    n, s = run(norm_model(TensorProto.FLOAT, cu=TensorProto.INT64), f)
    rn, _ = reference(f, 1e-5)
    assert_within_rounding(n, rn, np.float32, 16)
    assert not n[6:].any() and not s[6:].any() and s[2:6].any()


def test_cpu_default_epsilon(ort_library):
    f = feeds_for(np.float32, D=16, skip=False, bias=False)
    f["X"][:] = 1.0  # zero variance: the output is Beta + 0 * Gamma whatever epsilon, unless it is 0
    n, _ = run(norm_model(TensorProto.FLOAT, skip=False, bias=False), f)
    np.testing.assert_array_equal(n[2:], np.broadcast_to(f["Beta"], n[2:].shape))


@pytest.mark.parametrize(
    ("model", "feeds", "message"),
    [
        (norm_model(TensorProto.FLOAT, shaped=False), {"X": np.zeros(4, np.float32)}, "input 'X' must be 2-D"),
        (norm_model(TensorProto.FLOAT, shaped=False), {"Index": np.zeros((2, 1), np.int64)},
         r"input 'Index' must be 1-D \[R\], got shape \[2, 1\]"),
        (norm_model(TensorProto.FLOAT, shaped=False), {"Gamma": np.zeros(5, np.float32)},
         r"input 'Gamma' must have shape \[4\] \(X shape \[3, 4\]\), got \[5\]"),
        (norm_model(TensorProto.FLOAT, shaped=False), {"Skip": np.zeros((2, 4), np.float32)},
         r"input 'Skip' must have shape \[3, 4\]"),
        (norm_model(TensorProto.FLOAT, shaped=False, elems={"Bias": TensorProto.FLOAT16}),
         {"Bias": np.zeros(4, np.float16)}, "float16"),  # ORT's type check of the schema or the op's, per version
        (norm_model(TensorProto.DOUBLE, shaped=False),
         {k: np.zeros(v.shape) for k, v in feeds_for(np.float32, 3, 2, 4).items() if k != "Index"},
         "the CPU EP supports float and float16"),
        (norm_model(TensorProto.FLOAT, epsilon=-1.0), {}, "attribute 'epsilon' must be a finite float >= 0"),
        (norm_model(TensorProto.FLOAT, cu=TensorProto.INT32, shaped=False), {"CuSeqlens": np.zeros(0, np.int32)},
         r"input 'CuSeqlens' must be 1-D \[B\+1\] with at least 1 entry \(X shape \[3, 4\], Index shape \[2\]\), "
         r"got shape \[0\]"),
        (norm_model(TensorProto.FLOAT, cu=TensorProto.INT64, shaped=False), {"CuSeqlens": np.zeros((1, 2), np.int64)},
         r"input 'CuSeqlens' must be 1-D \[B\+1\] .* got shape \[1, 2\]"),
    ],
    ids=["x_rank", "index_rank", "gamma_shape", "skip_shape", "bias_type", "double", "epsilon", "cu_empty",
         "cu_rank"],
)  # fmt: skip
def test_cpu_errors_are_statuses(ort_library, model, feeds, message):
    f = feeds_for(np.float32, 3, 2, 4) | feeds
    with pytest.raises(ERRORS, match=message):
        run(model, f)


@pytest.mark.parametrize(("elem", "dtype"), [(TensorProto.FLOAT, np.float32), (TensorProto.INT16, np.int16)])
def test_cpu_refuses_other_cu_types(ort_library, elem, dtype):
    """CuSeqlens is int32 or int64: the op is registered per cu type (as RaggedLinear), so ONNX Runtime's type check
    refuses another type at session creation, naming the input; the kernel never sees it."""
    invalid = ort.capi.onnxruntime_pybind11_state.InvalidGraph
    with pytest.raises((*ERRORS, invalid), match=r"input parameter \(CuSeqlens\) of operator \(GatherLayerNorm\)"):
        run(norm_model(TensorProto.FLOAT, cu=elem), feeds_for(np.float32, 3, 2, 4) | {"CuSeqlens": np.zeros(2, dtype)})


@pytest.mark.gpu
@pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(), reason="needs onnxruntime-gpu")
@pytest.mark.parametrize(("T", "R", "D"), [(197, 91, 768), (25216, 11600, 768), (788, 400, 384), (20, 9, 4096)])
@pytest.mark.parametrize(("skip", "bias"), [(True, False), (False, False), (True, True)])
def test_cuda_matches_reference(ort_library, T, R, D, skip, bias):
    f = feeds_for(np.float16, T, R, D, skip, bias, seed=5)
    sess = create_session(norm_model(TensorProto.FLOAT16, skip=skip, bias=bias, epsilon=1e-6), "cuda")
    assert any(p.startswith("CUDA") for p in sess.get_providers())
    n, s = sess.run(None, f)
    rn, rs = reference(f, 1e-6)
    assert_within_rounding(n, rn, np.float16, D)
    assert_within_rounding(s, rs, np.float16, D)
    assert not n[:2].any() and not s[:2].any()


@pytest.mark.gpu
@pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(), reason="needs onnxruntime-gpu")
@pytest.mark.parametrize("cu_dtype", [np.int32, np.int64], ids=["int32", "int64"])
@pytest.mark.parametrize(("T", "R", "D", "last"), [(197, 197, 768, 0), (25216, 25216, 768, 11603), (788, 400, 384, 401),
                                                   (20, 9, 4096, 5), (1000, 1000, 768, -7)])  # fmt: skip
def test_cuda_live_rows(ort_library, cu_dtype, T, R, D, last):
    """The live rows equal the reference (the dead rows are never written: their contents are unspecified)."""
    f = feeds_for(np.float16, T, R, D, True, False, seed=6)
    f["CuSeqlens"] = np.array([0, min(max(last, 0), R) // 2, last], dtype=cu_dtype)
    live = min(max(last, 0), R)
    sess = create_session(norm_model(TensorProto.FLOAT16, bias=False, cu=CU_ELEM[cu_dtype], epsilon=1e-6), "cuda")
    assert any(p.startswith("CUDA") for p in sess.get_providers())
    n, s = sess.run(None, f)
    assert n.shape == s.shape == (R, D)
    rn, rs = reference(f, 1e-6)
    assert_within_rounding(n[:live], rn[:live], np.float16, D)
    assert_within_rounding(s[:live], rs[:live], np.float16, D)


@pytest.mark.gpu
@pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(), reason="needs onnxruntime-gpu")
@pytest.mark.parametrize(("D", "message"), [(20, "must be a multiple of 16"), (4112, "exceeds the widest")])
def test_cuda_unsupported_widths_are_statuses(ort_library, D, message):
    f = feeds_for(np.float16, 6, 4, D)
    with pytest.raises(Exception, match=message):
        run(norm_model(TensorProto.FLOAT16), f, "cuda")
