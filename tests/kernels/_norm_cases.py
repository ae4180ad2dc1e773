"""The gather + LayerNorm kernel in the interpreter: `python _norm_cases.py` under TRITON_INTERPRET=1 runs
`_norm_kernel._gather_layer_norm` on CPU tensors and prints JSON: per case the max |error| of the normed and summed
outputs against the float64 reference, in units of the output dtype's rounding bound (<= 1 passes), and whether the
rows of out-of-range indices are zero."""

from __future__ import annotations

import json
import sys

import torch

# (name, dtype, T, R, D, skip, bias, config (block_r, block_d, num_warps) or None = norm_config)
CASES = [
    ("fp32_skip_bias", torch.float32, 40, 37, 96, True, True, None),
    ("fp32_plain", torch.float32, 9, 20, 48, False, False, None),
    ("fp16_skip", torch.float16, 50, 33, 384, True, False, None),
    ("fp16_skip_bias_wide", torch.float16, 12, 7, 1100, True, True, None),
    ("fp16_odd_width_one_row_tiles", torch.float16, 30, 11, 300, True, True, (1, 512, 4)),
]  # no bfloat16: the interpreter rounds float32 -> bfloat16 differently from the GPU (its GPU test covers it)


def _run() -> dict:
    from raggedvit.kernels import _norm_kernel
    from raggedvit.kernels._norm_kernel import NormConfig
    from raggedvit.kernels.gather_layer_norm import _launch_gather_layer_norm, gather_layer_norm_reference

    gen = torch.Generator().manual_seed(0)
    out: dict = {}
    for name, dtype, T, R, D, skip, bias, cfg in CASES:
        x = (torch.randn(T, D, generator=gen) * 2 + 0.5).to(dtype)
        s = torch.randn(T, D, generator=gen).to(dtype) if skip else None
        b = torch.randn(D, generator=gen).to(dtype) if bias else None
        g = (torch.rand(D, generator=gen) + 0.5).to(dtype)
        be = torch.randn(D, generator=gen).to(dtype)
        index = torch.randint(-T, T, (R,), generator=gen)
        index[0], index[-1] = T, -T - 1  # out of range: zero rows
        config = None if cfg is None else NormConfig(*cfg)
        n, y = _launch_gather_layer_norm(x, index, g, be, s, b, 1e-6, kernels=_norm_kernel, config=config)
        rn, ry = gather_layer_norm_reference(x, index, g, be, s, b, 1e-6, compute_dtype=torch.float64)
        eps = torch.finfo(dtype).eps
        # rounding to the dtype (half an ulp) plus the fp32 sums' error (D * 2^-24 relative, tiny slack)
        slack = 0.5 * eps + D * 2.0**-24
        err_n = ((n.double() - rn).abs() / (slack * (rn.abs() + 1.0))).max()
        _, mag = gather_layer_norm_reference(
            x.abs(),
            index,
            g,
            be,
            None if s is None else s.abs(),
            None if b is None else b.abs(),
            1e-6,
            compute_dtype=torch.float64,
        )
        err_y = ((y.double() - ry).abs() / (slack * (ry.abs() + mag) + 1e-30)).max()  # the sum's operands' scale
        dead = max(float(n[[0, -1]].abs().max()), float(y[[0, -1]].abs().max()))
        out[name] = {"normed": float(err_n), "summed": float(err_y), "dead": dead}
    return out


if __name__ == "__main__":
    json.dump(_run(), sys.stdout)
