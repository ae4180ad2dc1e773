"""The bias + GELU kernel in the interpreter: `python _gelu_cases.py` under TRITON_INTERPRET=1 runs
`_linear_kernel._bias_gelu` on CPU tensors and prints JSON: per case the max |error| against a float64 GELU of the
fp32 sum, in units of the output dtype's half-ulp bound (<= 1 passes), and over every finite float16 input the
number of outputs that differ from the exactly rounded GELU (and by how many ulps at most). The same for
`_linear_kernel.gelu_poly` (the TMA linear kernel's epilogue GELU) through `_gelu_poly_probe` below, with its
largest relative error over float32 inputs in [-6, 8] and in the tail [-13, -6)."""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import torch
import triton
import triton.language as tl

from tests.support.testing import gelu_float64

# (name, dtype, shape, bias, config (block_m, block_n, num_warps) or None = gelu_config)
CASES = [
    ("fp32_bias", torch.float32, (37, 50), True, None),
    ("fp32_no_bias_3d", torch.float32, (3, 5, 24), False, None),
    ("fp16_bias_ragged_tiles", torch.float16, (19, 72), True, (4, 32, 1)),
    ("fp16_large_config", torch.float16, (1030, 48), True, None),
    ("fp16_one_row", torch.float16, (1, 16), True, None),
]


# half the spacing of the dtype's subnormals: the absolute rounding error of tiny outputs (the negative tail)
_SUBNORMAL_HALF_ULP = {dt: 0.5 * torch.finfo(dt).tiny * torch.finfo(dt).eps for dt in (torch.float16, torch.float32)}


@triton.jit
def _gelu_poly_probe(X, Y, n, BLOCK: tl.constexpr):
    """Y = gelu_poly(X) over n float32 inputs (Y float32)."""
    from raggedvit.kernels._linear_kernel import gelu_poly

    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(Y + offs, gelu_poly(tl.load(X + offs, mask=m, other=0.0)), mask=m)


def _gelu_poly(x: torch.Tensor) -> torch.Tensor:
    xf = x.float().contiguous().reshape(-1)
    y = torch.empty_like(xf)
    _gelu_poly_probe[(-(-xf.numel() // 1024),)](xf, y, xf.numel(), BLOCK=1024)
    return y.reshape(x.shape)


def _ordinal(h: torch.Tensor) -> torch.Tensor:
    """float16 values -> int32 ordinals: consecutive floats differ by 1, +0 and -0 are both 0."""
    b = h.view(torch.int16).int()
    return torch.where(b < 0, -(b & 0x7FFF), b)


def _poly_cases() -> dict:
    bits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    x = bits.view(torch.float16)
    x = x[torch.isfinite(x)]
    ref = gelu_float64(x.double())
    y16 = _gelu_poly(x).to(torch.float16)
    ulps = (_ordinal(y16) - _ordinal(ref.to(torch.float16))).abs()  # +0 and -0 are the same value here
    xs = torch.linspace(-6.0, 8.0, 200001, dtype=torch.float64).float()
    rel = ((_gelu_poly(xs).double() - gelu_float64(xs.double())).abs() / gelu_float64(xs.double()).abs()).nan_to_num()
    xt = torch.linspace(-13.0, -6.0, 20001, dtype=torch.float64)[:-1].float()
    rt = _gelu_poly(xt).double() / gelu_float64(xt.double())
    special = _gelu_poly(torch.tensor([math.inf, -math.inf, math.nan, 0.0, -0.0]))
    return {"inputs": x.numel(), "mismatches": int((ulps > 0).sum()), "max_ulps": int(ulps.max()),
            "max_rel_main": float(rel.max()), "tail_ratio": [float(rt.min()), float(rt.max())],
            "special": [float(v) for v in special]}  # fmt: skip


def _run() -> dict:
    from raggedvit.kernels import _linear_kernel
    from raggedvit.kernels._linear_config import GeluConfig
    from raggedvit.kernels._linear_launch import _launch_bias_gelu

    gen = torch.Generator().manual_seed(0)
    out: dict = {}
    for name, dtype, shape, bias, cfg in CASES:
        x = (torch.randn(shape, generator=gen) * 3).to(dtype)
        b = (torch.randn(shape[-1], generator=gen)).to(dtype) if bias else None
        poison = torch.full(shape, float("nan"), dtype=dtype)
        y = _launch_bias_gelu(x, b, kernels=_linear_kernel, config=None if cfg is None else GeluConfig(*cfg),
                              out=poison)  # fmt: skip
        ref = gelu_float64(x.double() + (0.0 if b is None else b.double()))
        eps = torch.finfo(dtype).eps
        # allowed: half an ulp of rounding plus the fp32 math's 1e-5 relative (_linear_kernel.gelu_erf), tiny slack
        bound = (0.5 * eps + 1e-5) * ref.abs() + _SUBNORMAL_HALF_ULP[dtype]
        out[name] = float(((y.double() - ref).abs() / bound).max())
    # every finite float16 input, no bias: how many outputs differ from the exactly rounded GELU
    bits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    x = bits.view(torch.float16)
    x = x[torch.isfinite(x)].reshape(-1, 16)
    y = _launch_bias_gelu(x, None, kernels=_linear_kernel)
    ref = gelu_float64(x).to(torch.float16)
    ulps = (y.view(torch.int16).int() - ref.view(torch.int16).int()).abs()
    mismatch = ulps > 0
    out["fp16_all_inputs"] = {
        "inputs": x.numel(),
        "mismatches": int(mismatch.sum()),
        "max_ulps": int(ulps.max()),
        "inf_nan": [
            float(v)
            for v in _launch_bias_gelu(
                torch.tensor([[math.inf, -math.inf, math.nan] + [0.0] * 13]), None, kernels=_linear_kernel
            )[0, :3]
        ],  # fmt: skip
    }
    # the fp32 erf form (torch's F.gelu) on the same inputs, for comparison
    torch_ref = torch.nn.functional.gelu(x.float()).to(torch.float16)
    out["fp16_all_inputs"]["torch_fp32_mismatches"] = int((torch_ref.view(torch.int16) != ref.view(torch.int16)).sum())
    out["gelu_poly"] = _poly_cases()
    return out


if __name__ == "__main__":
    np.seterr(all="ignore")
    json.dump(_run(), sys.stdout)
