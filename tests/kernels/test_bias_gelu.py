"""raggedvit.kernels.bias_gelu (the kernel of com.raggedvit::BiasGelu): the torch path against float64, input
checks, the launch config rule; the Triton kernel in the interpreter (CPU: every finite float16 input) and, with a
GPU, through the JIT (both launch configs, fp16 / bf16 / fp32)."""

from __future__ import annotations

import pytest
import torch
from _gelu_cases import CASES
from _interpreted import run_cases_interpreted

from raggedvit.kernels._linear_config import GELU_LARGE_M, aot_gelu_configs, gelu_config
from raggedvit.kernels.bias_gelu import bias_gelu, bias_gelu_reference
from tests.support.testing import gelu_float64


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("bias", [False, True])
def test_cpu_path_matches_float64(gen, dtype, bias):
    x = (torch.randn(4, 7, 24, generator=gen) * 3).to(dtype)
    b = torch.randn(24, generator=gen).to(dtype) if bias else None
    y = bias_gelu(x, b)
    assert y.shape == x.shape and y.dtype == dtype
    ref = gelu_float64(x.double() + (0.0 if b is None else b.double()))
    # torch's erf form (the reference) loses relative accuracy in the negative tail: ~1e-6 absolute slack
    bound = torch.finfo(dtype).eps * ref.abs() + 2e-6
    assert bool(((y.double() - ref).abs() <= bound).all())
    assert torch.equal(y, bias_gelu_reference(x, b))


@pytest.mark.parametrize(
    ("x", "bias", "message"),
    [
        (torch.tensor(1.0), None, "at least 1 dimension"),
        (torch.zeros(2, 4, dtype=torch.float64), None, "x dtype must be"),
        (torch.zeros(2, 4), torch.zeros(5), r"bias must be \[4\] torch.float32"),
        (torch.zeros(2, 4), torch.zeros(4, dtype=torch.float16), r"bias must be \[4\] torch.float32"),
    ],
)
def test_input_checks(x, bias, message):
    with pytest.raises(ValueError, match=message):
        bias_gelu(x, bias)


def test_config_rule():
    assert gelu_config(GELU_LARGE_M - 1) != gelu_config(GELU_LARGE_M)
    assert {gelu_config(1), gelu_config(GELU_LARGE_M)} == {c for _, c in aot_gelu_configs()}


# one pytest-xdist worker runs this module (`--dist loadgroup`), so its module fixtures run once
pytestmark = pytest.mark.xdist_group("test_bias_gelu")


@pytest.fixture(scope="module")
def interpreted_gelu() -> dict:
    """_gelu_cases.py under TRITON_INTERPRET=1."""
    return run_cases_interpreted("_gelu_cases.py")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_triton_kernel_in_interpreter(interpreted_gelu, case):
    err = interpreted_gelu[case[0]]
    assert err <= 1.0, f"{case[0]}: error {err} x the rounding bound"


def test_every_float16_input_in_interpreter(interpreted_gelu):
    """Over all 63,488 finite float16 inputs the kernel's output is the exactly rounded GELU but for a handful of
    1-ulp misses, fewer than the fp32 erf form (torch's F.gelu) makes; inf -> inf, -inf and nan -> nan (as the erf
    form gives: -inf * 0)."""
    r = interpreted_gelu["fp16_all_inputs"]
    assert r["inputs"] == 63488
    assert r["max_ulps"] <= 1 and r["mismatches"] <= 16, r
    assert r["mismatches"] < r["torch_fp32_mismatches"], r
    inf, ninf, nan = r["inf_nan"]
    assert inf == float("inf") and ninf != ninf and nan != nan


def test_gelu_poly_in_interpreter(interpreted_gelu):
    """The TMA linear kernel's epilogue GELU (`_linear_kernel.gelu_poly`, fp16 / bf16 outputs): relative error
    below 5e-6 for x in [-6, 8], within a factor 2.2 of the exact value below -6 (where |GELU| < 6e-9); over every
    finite float16 input at most 16 outputs 1 ulp from the exactly rounded GELU; inf -> inf, -inf -> 0, nan -> nan,
    +-0 -> 0."""
    r = interpreted_gelu["gelu_poly"]
    assert r["inputs"] == 63488
    assert r["max_ulps"] <= 1 and r["mismatches"] <= 16, r
    assert r["max_rel_main"] < 5e-6, r
    lo, hi = r["tail_ratio"]
    assert 1 / 2.2 < lo <= hi < 2.2, r
    inf, ninf, nan, zero, nzero = r["special"]
    assert inf == float("inf") and ninf == 0.0 and nan != nan and zero == 0.0 and nzero == 0.0, r


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", [(197, 3072), (GELU_LARGE_M + 3, 1536), (5, 40)], ids=str)
@pytest.mark.parametrize("bias", [False, True])
def test_triton_jit_matches_float64(gen, dtype, shape, bias):
    x = (torch.randn(shape, generator=gen) * 3).to(dtype).cuda()
    b = torch.randn(shape[-1], generator=gen).to(dtype).cuda() if bias else None
    y = bias_gelu(x, b)
    torch.cuda.synchronize()
    ref = gelu_float64(x.double() + (0.0 if b is None else b.double()))
    # relative 2e-6 + s^2 2^-22: the exp's argument -z^2 and the GPU's approximate exp2 grow with s^2 (H200: 2.1e-5
    # at s = -11.4, where |GELU| ~ 1e-29); + float32's smallest normal: the GPU flushes float32 subnormals to zero
    fi = torch.finfo(dtype)
    s = x.double() + (0.0 if b is None else b.double())
    rel = 0.5 * fi.eps + 2e-6 + s**2 * 2.0**-22
    bound = rel * ref.abs() + 0.5 * fi.tiny * fi.eps + torch.finfo(torch.float32).tiny
    assert float(((y.double() - ref).abs() / bound).max()) <= 1.0
