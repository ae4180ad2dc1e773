"""The bias + GELU kernel in the interpreter: `python _gelu_cases.py` under TRITON_INTERPRET=1 runs
`_linear_kernel._bias_gelu` on CPU tensors and prints JSON: per case the max |error| against a float64 GELU of the
fp32 sum, in units of the output dtype's half-ulp bound (<= 1 passes), and over every finite float16 input the
number of outputs that differ from the exactly rounded GELU (and by how many ulps at most)."""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import torch

from raggedvit.testing import gelu_float64

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
    return out


if __name__ == "__main__":
    np.seterr(all="ignore")
    json.dump(_run(), sys.stdout)
