"""com.raggedvit::RaggedLinear: CPU EP vs a numpy float64 reference, error statuses, and the CUDA EP (GPU only)."""

from __future__ import annotations

import math
import time

import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto

from raggedvit.kernels._linear_config import first_unwritten_row, linear_config
from raggedvit.runtime import create_session, run_with_iobinding
from tests.support.ort_models import linear_model
from tests.support.testing import assert_close

ELEM = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16}
CU_ELEM = {np.int32: TensorProto.INT32, np.int64: TensorProto.INT64}
TOL = {np.float32: 1e-5, np.float16: 2e-3}
_erf = np.vectorize(math.erf)


def reference(x, w, bias=None, residual=None, cu=None, activation=0) -> np.ndarray:
    """The op contract in float64: act(X W^T + Bias) + Residual on the live rows, zeros past them."""
    T = x.shape[0]
    v = x.astype(np.float64) @ w.astype(np.float64).T
    if bias is not None:
        v = v + bias.astype(np.float64)
    if activation == 1:
        v = 0.5 * v * (1.0 + _erf(v / math.sqrt(2.0)))
    if residual is not None:
        v = v + residual.astype(np.float64)
    live = T if cu is None else min(max(int(cu[-1]), 0), T)
    v[live:] = 0.0
    return v


def inputs(rng: np.random.Generator, T: int, N: int, K: int, dtype) -> dict[str, np.ndarray]:
    return {
        "X": rng.standard_normal((T, K)).astype(dtype),
        "W": (rng.standard_normal((N, K)) / math.sqrt(K)).astype(dtype),
        "Bias": rng.standard_normal(N).astype(dtype),
        "Residual": rng.standard_normal((T, N)).astype(dtype),
    }


def run_cpu(model: bytes, feeds: dict[str, np.ndarray]) -> np.ndarray:
    sess = create_session(model, "cpu", intra_op_threads=2)
    (y,) = sess.run(None, feeds)
    return y


def check(y: np.ndarray, ref: np.ndarray, dtype) -> None:
    assert y.dtype == np.dtype(dtype) and y.shape == ref.shape
    assert_close(torch.from_numpy(y.astype(np.float64)), torch.from_numpy(ref), rtol=TOL[dtype], name="Y")


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("cu_dtype", [None, np.int32, np.int64])
@pytest.mark.parametrize("activation", [0, 1])
def test_cpu_matches_reference(ort_library, dtype, bias, residual, cu_dtype, activation):
    rng = np.random.default_rng(7)
    T, N, K = 37, 24, 40
    data = inputs(rng, T, N, K, dtype)
    feeds = {"X": data["X"], "W": data["W"]}
    if bias:
        feeds["Bias"] = data["Bias"]
    if residual:
        feeds["Residual"] = data["Residual"]
    cu = None
    if cu_dtype is not None:
        cu = feeds["CuSeqlens"] = np.array([0, 10, 25, 29], dtype=cu_dtype)  # rows 29.. are dead
    model = linear_model(
        ELEM[dtype], bias=bias, residual=residual, cu_elem=CU_ELEM.get(cu_dtype), activation=activation
    )
    y = run_cpu(model, feeds)
    ref = reference(data["X"], data["W"], feeds.get("Bias"), feeds.get("Residual"), cu, activation)
    check(y, ref, dtype)
    if cu is not None:
        assert not y[29:].any(), "dead rows must be zero"


@pytest.mark.parametrize(("cu", "live"), [([0, 5, 1000], 12), ([0, -3], 0), ([0], 0), ([0, 4, 7], 7)])
@pytest.mark.parametrize("cu_dtype", [np.int32, np.int64])
def test_cpu_live_count_is_clamped(ort_library, cu, live, cu_dtype):
    """live = clamp(cu[B], 0, T): values above T mean every row, negative ones and B = 0 mean none."""
    rng = np.random.default_rng(1)
    data = inputs(rng, 12, 8, 16, np.float32)
    feeds = {"X": data["X"], "W": data["W"], "Residual": data["Residual"], "CuSeqlens": np.array(cu, cu_dtype)}
    y = run_cpu(linear_model(TensorProto.FLOAT, residual=True, cu_elem=CU_ELEM[cu_dtype]), feeds)
    ref = reference(data["X"], data["W"], residual=data["Residual"], cu=np.array(cu))
    check(y, ref, np.float32)
    assert not y[live:].any() and (live == 0 or y[:live].any())


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_cpu_zero_rows(ort_library, dtype):
    data = inputs(np.random.default_rng(2), 0, 8, 16, dtype)
    y = run_cpu(linear_model(ELEM[dtype], bias=True), {"X": data["X"], "W": data["W"], "Bias": data["Bias"]})
    assert y.shape == (0, 8) and y.dtype == np.dtype(dtype)


def test_cpu_deit_tiny_sizes_are_fast(ort_library):
    """fc1 of deit_tiny over a capacity of ~800 rows (K 192, N 768): well under a second."""
    rng = np.random.default_rng(3)
    data = inputs(rng, 800, 768, 192, np.float16)
    feeds = {**data, "CuSeqlens": np.array([0, 197, 394, 700], np.int64)}
    sess = create_session(
        linear_model(TensorProto.FLOAT16, bias=True, residual=True, cu_elem=TensorProto.INT64, activation=1), "cpu"
    )
    sess.run(None, feeds)
    t0 = time.perf_counter()
    (y,) = sess.run(None, feeds)
    assert time.perf_counter() - t0 < 0.5
    check(y, reference(data["X"], data["W"], data["Bias"], data["Residual"], feeds["CuSeqlens"], 1), np.float16)


def expect_error(model: bytes, feeds: dict[str, np.ndarray], *parts: str) -> str:
    with pytest.raises(Exception) as info:
        run_cpu(model, feeds)
    text = str(info.value)
    assert "RaggedLinear" in text, text
    for part in parts:
        assert part in text, f"{part!r} not in {text!r}"
    return text


def f32(*shape: int) -> np.ndarray:
    return np.zeros(shape, np.float32)


@pytest.mark.parametrize(
    ("feeds", "kw", "parts"),
    [
        (
            {"X": f32(100, 192), "W": f32(576, 191)},
            {},
            ["input 'W' must be 2-D [N, K] with K = 192 (X shape [100, 192]), got shape [576, 191]"],
        ),
        ({"X": f32(2, 5, 8), "W": f32(4, 8)}, {}, ["input 'X' must be 2-D [T, K], got shape [2, 5, 8]"]),
        ({"X": f32(5, 8), "W": f32(32)}, {}, ["input 'W' must be 2-D [N, K] with K = 8", "got shape [32]"]),
        (
            {"X": f32(5, 8), "W": f32(4, 8), "Bias": f32(5)},
            {"bias": True},
            ["input 'Bias' must be 1-D [N] = [4]", "W shape [4, 8]", "got shape [5]"],
        ),
        (
            {"X": f32(5, 8), "W": f32(4, 8), "Residual": f32(4, 5)},
            {"residual": True},
            ["input 'Residual' must be 2-D [T, N] = [5, 4]", "X shape [5, 8]", "got shape [4, 5]"],
        ),
        (
            {"X": f32(5, 8), "W": f32(4, 8), "CuSeqlens": np.zeros((2, 2), np.int64)},
            {"cu_elem": TensorProto.INT64},
            ["input 'CuSeqlens' must be 1-D [B+1]", "got shape [2, 2]"],
        ),
        (
            {"X": f32(5, 8), "W": f32(4, 8), "CuSeqlens": np.zeros(0, np.int32)},
            {"cu_elem": TensorProto.INT32},
            ["input 'CuSeqlens' must be 1-D [B+1] with at least 1 entry", "got shape [0]"],
        ),
    ],
)
def test_cpu_shape_errors_name_input_and_shapes(ort_library, feeds, kw, parts):
    expect_error(linear_model(TensorProto.FLOAT, any_rank=True, **kw), feeds, *parts)


@pytest.mark.parametrize(("activation", "part"), [(2, "must be in [0, 1], got 2"), (-1, "got -1"), (1.0, "an int")])
def test_cpu_bad_activation(ort_library, activation, part):
    expect_error(linear_model(TensorProto.FLOAT, activation=activation), {"X": f32(3, 8), "W": f32(4, 8)}, part)


def test_cpu_refuses_bfloat16_and_mixed_types(ort_library):
    bf16 = np.zeros((3, 8), np.uint16)  # bfloat16 bits
    model = linear_model(TensorProto.BFLOAT16)
    x, w = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bf16, TensorProto.BFLOAT16), None
    w = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(np.zeros((4, 8), np.uint16), TensorProto.BFLOAT16)
    sess = create_session(model, "cpu")
    with pytest.raises(Exception, match=r"RaggedLinear: input 'X' \(shape \[3, 8\]\) has element type bfloat16"):
        sess.run_with_ort_values(["Y"], {"X": x, "W": w})
    mixed = linear_model(TensorProto.FLOAT, elems={"W": TensorProto.FLOAT16})
    try:
        sess = create_session(mixed, "cpu")
    except Exception as e:  # noqa: BLE001 - ORT may refuse the node itself; the op must never see it then
        assert "RaggedLinear" in str(e) or "type" in str(e).lower(), e
        return
    with pytest.raises(Exception, match=r"input 'W' \(shape \[4, 8\]\) has element type float16, X"):
        sess.run(None, {"X": f32(3, 8), "W": np.zeros((4, 8), np.float16)})


# ---- CUDA EP (AOT Triton cubins) ------------------------------------------------------------------------------

GPU_MARKS = (
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(), reason="needs onnxruntime-gpu"),
)


def gpu(fn):
    """Marks a CUDA-EP test (skipped without CUDA or onnxruntime-gpu)."""
    for mark in GPU_MARKS:
        fn = mark(fn)
    return fn


TORCH_ELEM = {torch.float16: TensorProto.FLOAT16, torch.bfloat16: TensorProto.BFLOAT16}
GPU_TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def run_cuda(model: bytes, feeds: dict[str, torch.Tensor], T: int, N: int, dtype: torch.dtype) -> torch.Tensor:
    sess = create_session(model, "cuda", disable_cpu_fallback=True)
    y = torch.full((T, N), float("nan"), dtype=dtype, device="cuda")
    run_with_iobinding(sess, {k: v.cuda() for k, v in feeds.items()}, {"Y": y})
    torch.cuda.synchronize()
    return y.cpu()


def torch_reference(feeds: dict[str, torch.Tensor], activation: int) -> torch.Tensor:
    def np64(name: str) -> np.ndarray | None:
        return feeds[name].double().numpy() if name in feeds else None

    cu = feeds["CuSeqlens"].numpy() if "CuSeqlens" in feeds else None
    ref = reference(np64("X"), np64("W"), np64("Bias"), np64("Residual"), cu, activation)
    return torch.from_numpy(ref)


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cu_dtype", [None, torch.int32, torch.int64])
@pytest.mark.parametrize(
    ("T", "N", "K"),
    # small_narrow, small_wide, then (sm_90) tma: 54 tiles (one per program), 594 tiles (several per program)
    [(100, 512, 192), (300, 2048, 256), (1100, 768, 192), (4100, 2304, 256)],
)
@pytest.mark.parametrize("activation", [0, 1])
@pytest.mark.parametrize("extras", [False, True])
def test_cuda_matches_reference(ort_library, dtype, cu_dtype, T, N, K, activation, extras):
    gen = torch.Generator().manual_seed(T + N + K)
    feeds = {
        "X": torch.randn(T, K, generator=gen).to(dtype),
        "W": (torch.randn(N, K, generator=gen) / math.sqrt(K)).to(dtype),
    }
    if extras:
        feeds["Bias"] = torch.randn(N, generator=gen).to(dtype)
        feeds["Residual"] = torch.randn(T, N, generator=gen).to(dtype)
    live = T
    if cu_dtype is not None:
        live = T - T // 3
        feeds["CuSeqlens"] = torch.tensor([0, live // 2, live], dtype=cu_dtype)
        feeds["X"][live:] = float("nan")  # dead rows hold anything: they must reach no live row
    model = linear_model(
        TORCH_ELEM[dtype],
        bias=extras,
        residual=extras,
        cu_elem=None if cu_dtype is None else (TensorProto.INT32 if cu_dtype == torch.int32 else TensorProto.INT64),
        activation=activation,
    )
    y = run_cuda(model, feeds, T, N, dtype)
    ref = torch_reference(feeds, activation).to(dtype)
    assert_close(y[:live], ref[:live], rtol=GPU_TOL[dtype], name="Y")
    # run_cuda poisons Y with NaN: the pointer kernel never writes a dead row, the TMA kernel (sm_90 from LARGE_T
    # rows) none past its last live tile
    major, minor = torch.cuda.get_device_capability()
    config = linear_config(T, N, 10 * major + minor, cu_dtype is not None)
    untouched = first_unwritten_row(config, live)
    assert y[untouched:].isnan().all(), f"the CUDA kernel wrote rows past {untouched} (live {live})"


@gpu
@pytest.mark.parametrize(("cu", "live"), [([0, 5000], 64), ([0, -7], 0), ([0], 0)])
def test_cuda_live_count_is_clamped(ort_library, cu, live):
    feeds = {"X": torch.randn(64, 32).half(), "W": torch.randn(48, 32).half(), "CuSeqlens": torch.tensor(cu)}
    y = run_cuda(linear_model(TensorProto.FLOAT16, cu_elem=TensorProto.INT64), feeds, 64, 48, torch.float16)
    assert_close(y[:live], torch_reference(feeds, 0).half()[:live], rtol=GPU_TOL[torch.float16], name="Y")
    assert y[live:].isnan().all()


@gpu
@pytest.mark.parametrize(("K", "N"), [(200, 64), (64, 100)])
def test_cuda_refuses_sizes_not_multiple_of_16(ort_library, K, N):
    sess = create_session(linear_model(TensorProto.FLOAT16), "cuda", disable_cpu_fallback=True)
    feeds = {"X": torch.randn(8, K).half().cuda(), "W": torch.randn(N, K).half().cuda()}
    with pytest.raises(Exception, match=r"RaggedLinear: K = \d+ and N = \d+ must be multiples of 16") as info:
        run_with_iobinding(sess, feeds, ["Y"])
    assert f"X shape [8, {K}], W shape [{N}, {K}]" in str(info.value)


@gpu
def test_cuda_session_places_float_nodes_on_cpu(ort_library):
    """No fp32 CUDA kernel: with CPU fallback, a float node runs on the CPU EP and still matches."""
    sess = create_session(linear_model(TensorProto.FLOAT, bias=True), "cuda")
    rng = np.random.default_rng(4)
    data = inputs(rng, 20, 16, 32, np.float32)
    (y,) = sess.run(None, {"X": data["X"], "W": data["W"], "Bias": data["Bias"]})
    check(y, reference(data["X"], data["W"], data["Bias"]), np.float32)


@gpu
def test_cuda_zero_rows(ort_library):
    sess = create_session(
        linear_model(TensorProto.BFLOAT16, cu_elem=TensorProto.INT32), "cuda", disable_cpu_fallback=True
    )
    feeds = {"X": torch.zeros(0, 32, dtype=torch.bfloat16), "W": torch.zeros(16, 32, dtype=torch.bfloat16),
             "CuSeqlens": torch.tensor([0], dtype=torch.int32)}  # fmt: skip
    (y,) = run_with_iobinding(sess, {k: v.cuda() for k, v in feeds.items()}, ["Y"])
    assert y.shape() == [0, 16]
