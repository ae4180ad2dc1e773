"""The ragged linear op (raggedvit.kernels.ragged_linear, torch.ops.raggedvit.ragged_linear) against the float64
reference: dtypes, optional inputs, the live count (clamping; dead rows: zero from the CPU path, never written by
the Triton kernel), input checks; the Triton kernel in the interpreter (CPU) and, with a GPU, through the JIT (every
launch config)."""

from __future__ import annotations

import pytest
import torch
from _interpreted import run_cases_interpreted
from _linear_cases import INTERPRETED, TMA_INTERPRETED, make

from raggedvit.kernels import ragged_linear, ragged_linear_reference
from raggedvit.kernels._linear_config import (
    CAPACITY_NARROW_N,
    LARGE_T,
    NARROW_N,
    LinearConfig,
    aot_linear_configs,
    first_unwritten_row,
    linear_config,
)
from raggedvit.kernels._linear_launch import _launch_linear
from tests.support.testing import assert_close, default_tolerance

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _ref(x, w, b, r, cu, act):
    return ragged_linear_reference(x, w, b, r, cu, act, compute_dtype=torch.float64)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("act", [0, 1])
@pytest.mark.parametrize(("bias", "residual"), [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("live", [None, 11])
def test_op_matches_reference(gen, dtype, act, bias, residual, live):
    x, w, b, r, cu = make(dtype, 19, 24, 12, live, bias, residual, gen)
    ref = _ref(x, w, b, r, cu, act)
    for y in (ragged_linear(x, w, b, r, cu, act), torch.ops.raggedvit.ragged_linear(x, w, b, r, cu, act)):
        assert y.dtype == dtype and y.shape == (19, 12)
        assert_close(y, ref, name=f"{dtype} act={act}")
        if live is not None:  # the CPU path (the reference math) writes zeros to the dead rows
            assert torch.equal(y[live:], torch.zeros_like(y[live:]))


@pytest.mark.parametrize("cu_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize(("last", "live"), [(-3, 0), (0, 0), (5, 5), (9, 9), (40, 9)])
def test_live_count_is_clamped(gen, cu_dtype, last, live):
    x, w, b, r, _ = make(torch.float32, 9, 8, 4, None, True, True, gen)
    cu = torch.tensor([0, min(max(last, 0), 2), last], dtype=cu_dtype)
    y = ragged_linear(x, w, b, r, cu, 1)
    full = _ref(x, w, b, r, None, 1)
    assert_close(y[:live], full[:live])
    assert torch.equal(y[live:], torch.zeros_like(y[live:]))


def test_empty_rows_and_batch(gen):
    x, w, b, r, _ = make(torch.float16, 0, 8, 4, None, True, True, gen)
    assert ragged_linear(x, w, b, r, torch.zeros(1, dtype=torch.int64)).shape == (0, 4)
    x, w, _, _, _ = make(torch.float32, 3, 8, 4, None, False, False, gen)
    y = ragged_linear(x, w, cu_seqlens=torch.zeros(1, dtype=torch.int32))  # B = 0: cu = [0], no live row
    assert torch.equal(y, torch.zeros(3, 4))


def test_compile_fullgraph(gen):
    x, w, b, r, cu = make(torch.float32, 10, 16, 8, 6, True, True, gen)
    fn = torch.compile(lambda x, r: ragged_linear(x, w, b, r, cu, 1), fullgraph=True, backend="eager")
    assert_close(fn(x, r), _ref(x, w, b, r, cu, 1))


def test_fake_tensor_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        y = ragged_linear(torch.empty(7, 16), torch.empty(32, 16), torch.empty(32), None, torch.empty(3).long(), 1)
    assert y.shape == (7, 32) and y.dtype == torch.float32


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"x": torch.zeros(2, 3, 4)}, "x must be 2-D"),
        ({"x": torch.zeros(2, 8, dtype=torch.float64)}, "x dtype must be"),
        ({"weight": torch.zeros(4, 7)}, "weight must be [N, K=8]"),
        ({"weight": torch.zeros(4, 8, dtype=torch.float16)}, "weight must be [4, 8] torch.float32"),
        ({"bias": torch.zeros(5)}, "bias must be [4]"),
        ({"residual": torch.zeros(3, 4)}, "residual must be [2, 4]"),
        ({"cu_seqlens": torch.zeros(2, 2, dtype=torch.int64)}, "cu_seqlens must be 1-D"),
        ({"cu_seqlens": torch.zeros(2)}, "cu_seqlens dtype must be int32 or int64"),
        ({"activation": 2}, "activation must be 0"),
    ],
)
def test_input_checks(kwargs, message):
    args = {"x": torch.zeros(2, 8), "weight": torch.zeros(4, 8), **kwargs}
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        ragged_linear(**args)


@pytest.fixture(scope="module")
def interpreted_errors() -> dict[str, list[float]]:
    """_linear_cases.py in a process started with TRITON_INTERPRET=1 (the kernel needs it set before triton's
    import): {case: [relative error of the live rows vs float64, 1.0 if the poisoned dead rows are untouched]}."""
    return run_cases_interpreted("_linear_cases.py")


@pytest.mark.parametrize("case", INTERPRETED + TMA_INTERPRETED, ids=lambda c: c[0])
def test_triton_kernel_in_interpreter(interpreted_errors, case):
    name, dtype = case[0], case[1]
    err, untouched = interpreted_errors[name]
    assert err <= default_tolerance(dtype), f"{name}: relative error {err}"
    assert untouched == 1.0, f"{name}: the kernel wrote a dead row"


@pytest.mark.parametrize("split", [0, 3, 4])
def test_config_epilogue_split_is_one_or_two(split):
    with pytest.raises(ValueError, match="epilogue_split must be 1 or 2"):
        LinearConfig(64, 128, 64, 4, 4, tma=True, epilogue_split=split)


def test_config_rule():
    c = dict(aot_linear_configs())
    assert linear_config(LARGE_T - 1, NARROW_N) == linear_config(LARGE_T - 1, NARROW_N, 90, True) == c["small_narrow"]
    assert linear_config(LARGE_T - 1, NARROW_N + 16, 90, True) == c["small_wide"]
    # sm_90 from LARGE_T rows: the persistent TMA kernel, with or without a live count
    assert linear_config(LARGE_T, 768, 90) == linear_config(LARGE_T, 768, 90, True) == c["tma"] and c["tma"].tma
    assert linear_config(LARGE_T, 768) == c["large"] and linear_config(LARGE_T, 768, 90, tma=False) == c["xlarge"]
    # a live count (capacity layout) without TMA: 64 x 64 tiles up to CAPACITY_NARROW_N columns from LARGE_T rows
    assert linear_config(LARGE_T, CAPACITY_NARROW_N, 80, True) == c["small_wide"]
    assert linear_config(LARGE_T, CAPACITY_NARROW_N + 16, 90, True, tma=False) == c["xlarge"]
    assert linear_config(LARGE_T, CAPACITY_NARROW_N + 16, 80, True) == c["large"]
    assert not any(cfg.tma for name, cfg in c.items() if name != "tma")


# ---- GPU: the JIT kernel, every launch config (T below / above LARGE_T, N below / above NARROW_N) -------------
# (with a live count, as these launches have: above LARGE_T rows N must pass CAPACITY_NARROW_N for the large tiles)
GPU_SHAPES = [(300, 192, NARROW_N), (300, 192, NARROW_N + 64), (LARGE_T + 50, 256, CAPACITY_NARROW_N + 64)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("T", "K", "N"), GPU_SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("act", [0, 1])
def test_triton_jit_matches_reference(gen, dtype, T, K, N, act):
    configs = {linear_config(t, n, None, True) for t, _, n in GPU_SHAPES}
    assert len(configs) == 3, "the GPU shapes must reach every launch config"
    live = T - 70
    x, w, b, r, cu = make(dtype, T, K, N, live, True, True, gen, cu_dtype=torch.int32, device="cuda")
    y = ragged_linear(x, w, b, r, cu, act)
    ref = _ref(x, w, b, r, cu, act).to(dtype)
    assert_close(y[:live], ref[:live], rtol=2 * default_tolerance(dtype), name=f"{T}x{K}x{N}")
    poison = torch.full((T, N), float("nan"), dtype=dtype, device="cuda")
    y = _launch_linear(x, w, b, r, cu, act, out=poison)  # dead rows (past the last live tile for TMA) never written
    major, minor = torch.cuda.get_device_capability()
    untouched = first_unwritten_row(linear_config(T, N, 10 * major + minor, True), live)
    assert torch.equal(y[:live], ragged_linear(x, w, b, r, cu, act)[:live]) and bool(y[untouched:].isnan().all())
    y_op = torch.ops.raggedvit.ragged_linear(x, w, None, None, None, act)
    assert_close(y_op, _ref(x, w, None, None, None, act).to(dtype), rtol=2 * default_tolerance(dtype))


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0), reason="needs TMA (sm_90)"
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("T", "K", "N", "live"), [(LARGE_T + 50, 256, 768, 700), (5000, 192, 2304, 4321),
                                                   (5000, 3072, 768, 5000), (2000, 64, 64, 0)])  # fmt: skip
@pytest.mark.parametrize("act", [0, 1])
def test_tma_kernel_matches_reference(gen, dtype, T, K, N, live, act):
    """The persistent TMA kernel (linear_config's pick on sm_90 from LARGE_T rows): one or several tiles per program,
    NaN in the dead rows of X (TMA loads them into the last live tile), a NaN-poisoned output whose rows past the
    last live tile stay untouched."""
    assert linear_config(T, N, 90, True).tma
    x, w, b, r, cu = make(dtype, T, K, N, live, True, True, gen, cu_dtype=torch.int32, device="cuda")
    ref = _ref(x, w, b, r, cu, act).to(dtype)
    x[live:] = float("nan")
    poison = torch.full((T, N), float("nan"), dtype=dtype, device="cuda")
    y = _launch_linear(x, w, b, r, cu, act, out=poison)
    assert_close(y[:live], ref[:live], rtol=2 * default_tolerance(dtype), name=f"{T}x{K}x{N}")
    assert bool(y[first_unwritten_row(linear_config(T, N, 90, True), live) :].isnan().all())
    pointer = _launch_linear(x, w, b, r, cu, act, config=linear_config(T, N, 90, True, tma=False))
    assert_close(y[:live], pointer[:live], rtol=2 * default_tolerance(dtype), name="tma vs pointer")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_fp32_and_compile(gen):
    x, w, b, r, cu = make(torch.float32, 40, 32, 48, 25, True, True, gen, device="cuda")
    y = torch.compile(lambda x: ragged_linear(x, w, b, r, cu, 1), fullgraph=True)(x)
    assert_close(y, _ref(x, w, b, r, cu, 1).float(), rtol=1e-3)  # torch math: cuBLAS may use tf32
    assert torch.equal(y[25:], torch.zeros_like(y[25:]))
