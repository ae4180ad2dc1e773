"""raggedvit.kernels.gather_layer_norm (the kernel of com.raggedvit::GatherLayerNorm): the torch path against
float64 and against torch's own Gather + LayerNorm, the live count (cu_seqlens), input checks, the launch config
rule; the Triton kernel in the interpreter (CPU; dead rows of a poisoned output never written) and, with a GPU,
through the JIT (every launch config, fp16 / bf16 / fp32, with and without a live count)."""

from __future__ import annotations

import pytest
import torch
from _interpreted import run_cases_interpreted
from _norm_cases import CASES

from raggedvit.kernels._norm_kernel import NORM_BLOCK_DS, aot_norm_configs, norm_config
from raggedvit.kernels.gather_layer_norm import gather_layer_norm, gather_layer_norm_reference


def _inputs(gen, dtype, T=30, R=21, D=64, device="cpu"):
    x = (torch.randn(T, D, generator=gen) * 2).to(dtype).to(device)
    skip = torch.randn(T, D, generator=gen).to(dtype).to(device)
    bias = torch.randn(D, generator=gen).to(dtype).to(device)
    gamma = (torch.rand(D, generator=gen) + 0.5).to(dtype).to(device)
    beta = torch.randn(D, generator=gen).to(dtype).to(device)
    index = torch.randint(0, T, (R,), generator=gen).to(device)
    return x, index, gamma, beta, skip, bias


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_cpu_path_is_gather_add_layer_norm(gen, dtype):
    x, index, gamma, beta, skip, bias = _inputs(gen, dtype)
    n, s = gather_layer_norm(x, index, gamma, beta, skip, bias, eps=1e-6)
    f = torch.float32
    want_s = (x.to(f) + skip.to(f) + bias.to(f))[index]
    want_n = torch.nn.functional.layer_norm(want_s, (x.shape[1],), gamma.to(f), beta.to(f), 1e-6)
    assert n.dtype == s.dtype == dtype and n.shape == s.shape == (21, 64)
    torch.testing.assert_close(s, want_s.to(dtype), rtol=0, atol=0)
    torch.testing.assert_close(n, want_n.to(dtype), rtol=0, atol=0)
    # without skip / bias: torch's Gather + LayerNorm
    n0, s0 = gather_layer_norm(x, index, gamma, beta)
    assert torch.equal(s0, x[index])
    want_n0 = torch.nn.functional.layer_norm(x.to(f)[index], (64,), gamma.to(f), beta.to(f))
    torch.testing.assert_close(n0, want_n0.to(dtype))


def test_negative_and_out_of_range_indices(gen):
    x, _, gamma, beta, skip, bias = _inputs(gen, torch.float32, T=5)
    index = torch.tensor([-1, 4, 5, -6, 0])
    n, s = gather_layer_norm(x, index, gamma, beta, skip, bias)
    assert torch.equal(s[0], s[1]) and torch.equal(n[0], n[1])  # -1 is row 4
    assert not s[2].any() and not s[3].any() and not n[2].any() and not n[3].any()
    ref = gather_layer_norm_reference(x, index, gamma, beta, skip, bias, compute_dtype=torch.float64)
    assert ref[0].dtype == torch.float64 and torch.allclose(n.double(), ref[0], atol=1e-5)


@pytest.mark.parametrize("cu_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize(("last", "live"), [(0, 0), (9, 9), (21, 21), (40, 21), (-3, 0)])
def test_cpu_path_live_rows(gen, cu_dtype, last, live):
    """Rows below clamp(cu[B], 0, R) are the function without cu_seqlens; the CPU path writes zeros past it."""
    x, index, gamma, beta, skip, bias = _inputs(gen, torch.float16)
    cu = torch.tensor([0, 5, last], dtype=cu_dtype)
    n, s = gather_layer_norm(x, index, gamma, beta, skip, bias, 1e-6, cu_seqlens=cu)
    n_all, s_all = gather_layer_norm(x, index, gamma, beta, skip, bias, 1e-6)
    assert torch.equal(n[:live], n_all[:live]) and torch.equal(s[:live], s_all[:live])
    assert not n[live:].any() and not s[live:].any()
    assert n.shape == s.shape == (21, 64)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"x": torch.zeros(4)}, "x must be 2-D"),
        ({"x": torch.zeros(3, 4, dtype=torch.float64)}, "x dtype must be"),
        ({"index": torch.zeros(2, dtype=torch.int32)}, "index must be 1-D int64"),
        ({"gamma": torch.zeros(5)}, r"gamma must be \[4\] torch.float32"),
        ({"skip": torch.zeros(2, 4)}, r"skip must be \[3, 4\] torch.float32"),
        ({"bias": torch.zeros(4, dtype=torch.float16)}, r"bias must be \[4\] torch.float32"),
        ({"cu_seqlens": torch.zeros(0, dtype=torch.int32)}, r"cu_seqlens must be 1-D \[B\+1\] with B >= 0, got"),
        ({"cu_seqlens": torch.zeros(1, 2, dtype=torch.int32)}, r"cu_seqlens must be 1-D .* got shape \(1, 2\)"),
        ({"cu_seqlens": torch.zeros(2)}, "cu_seqlens dtype must be int32 or int64, got torch.float32"),
    ],
)
def test_input_checks(kw, message):
    args = {"x": torch.zeros(3, 4), "index": torch.zeros(2, dtype=torch.int64), "gamma": torch.ones(4),
            "beta": torch.zeros(4), "skip": None, "bias": None, "cu_seqlens": None} | kw  # fmt: skip
    with pytest.raises(ValueError, match=message):
        gather_layer_norm(**args)


def test_config_rule():
    assert norm_config(max(NORM_BLOCK_DS) + 1) is None
    assert [norm_config(d).block_d for d in (1, 256, 257, 768, 1024, 1280, 4096)] == [256, 256, 512, 1024, 1024,
                                                                                      2048, 4096]  # fmt: skip
    assert {norm_config(d) for d in NORM_BLOCK_DS} == set(aot_norm_configs())
    assert all(c.block_r * c.block_d == 2048 or c.block_r == 1 for c in aot_norm_configs())  # 2,048 elements


@pytest.fixture(scope="module")
def interpreted_norm() -> dict:
    """_norm_cases.py under TRITON_INTERPRET=1."""
    return run_cases_interpreted("_norm_cases.py")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_triton_kernel_in_interpreter(interpreted_norm, case):
    got = interpreted_norm[case[0]]
    assert got["normed"] <= 1.0 and got["summed"] <= 1.0, f"{case[0]}: {got} x the rounding bound"
    assert got["dead"] == 0.0, f"{case[0]}: rows of out-of-range indices are not zero"
    assert got["untouched"], f"{case[0]}: a dead row (at or past {got['live']}) was written"
    assert got["ref_dead_zero"], f"{case[0]}: the reference's dead rows are not zero"


def test_interpreter_cases_cover_the_live_counts():
    """0, inside a row tile, a tile edge, every row, above R (clamped), the int64 range, negative (clamped)."""
    lives = {(c[8], min(max(c[8], 0), c[3])) for c in CASES if c[8] is not None}
    assert {0, 11, 16, 21} <= {live for _, live in lives}
    assert any(last > c for (last, c) in lives) and any(last < 0 for last, _ in lives)
    assert {c[9] for c in CASES if c[8] is not None} == {torch.int32, torch.int64}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("D", [48, 384, 768, 1100, 4096])
@pytest.mark.parametrize("with_skip", [False, True])
def test_triton_jit_matches_reference(gen, dtype, D, with_skip):
    x, index, gamma, beta, skip, bias = _inputs(gen, dtype, T=300, R=257, D=D, device="cuda")
    index[0], index[1] = -1, 300
    skip, bias = (skip, bias) if with_skip else (None, None)
    n, s = gather_layer_norm(x, index, gamma, beta, skip, bias, eps=1e-6)
    torch.cuda.synchronize()
    rn, rs = gather_layer_norm_reference(x, index, gamma, beta, skip, bias, 1e-6)
    tol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 2e-5}[dtype]
    torch.testing.assert_close(s, rs, rtol=tol, atol=tol)
    torch.testing.assert_close(n, rn, rtol=tol, atol=tol)
    assert not n[1].any() and not s[1].any()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("cu_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize(("D", "last"), [(768, 0), (768, 129), (384, 257), (1100, 300), (4096, -1), (48, 2**40)])
def test_triton_jit_live_rows(gen, cu_dtype, D, last):
    """The live rows equal the reference; the dead rows of NaN-poisoned outputs are never written."""
    from raggedvit.kernels.gather_layer_norm import _launch_gather_layer_norm

    x, index, gamma, beta, skip, bias = _inputs(gen, torch.float16, T=300, R=257, D=D, device="cuda")
    if cu_dtype == torch.int32 and last > 2**31 - 1:
        last = 2**31 - 1
    cu = torch.tensor([0, 100, last], dtype=cu_dtype, device="cuda")
    live = min(max(last, 0), 257)
    poison = tuple(torch.full((257, D), float("nan"), dtype=torch.float16, device="cuda") for _ in range(2))
    n, s = _launch_gather_layer_norm(x, index, gamma, beta, skip, bias, 1e-6, cu_seqlens=cu, out=poison)
    torch.cuda.synchronize()
    rn, rs = gather_layer_norm_reference(x, index, gamma, beta, skip, bias, 1e-6, cu)
    torch.testing.assert_close(s[:live], rs[:live], rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(n[:live], rn[:live], rtol=2e-3, atol=2e-3)
    assert n[live:].isnan().all() and s[live:].isnan().all()
    n2, s2 = gather_layer_norm(x, index, gamma, beta, skip, bias, 1e-6, cu_seqlens=cu)  # the public path
    assert torch.equal(n2[:live], n[:live]) and torch.equal(s2[:live], s[:live])
