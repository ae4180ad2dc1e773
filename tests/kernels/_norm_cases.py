"""The gather + LayerNorm kernel in the interpreter: `python _norm_cases.py` under TRITON_INTERPRET=1 runs
`_norm_kernel._gather_layer_norm` on CPU tensors and prints JSON: per case the max |error| of the normed and summed
live rows against the float64 reference, in units of the output dtype's rounding bound (<= 1 passes), whether the
live rows of out-of-range indices are zero, and whether the dead rows (past clamp(cu[B], 0, R)) of NaN-poisoned
outputs were left untouched."""

from __future__ import annotations

import json
import sys

import torch

# (name, dtype, T, R, D, skip, bias, config (block_r, block_d, num_warps) or None = norm_config,
#  cu[B] or None = no CuSeqlens, CuSeqlens dtype)
CASES = [
    ("fp32_skip_bias", torch.float32, 40, 37, 96, True, True, None, None, None),
    ("fp32_plain", torch.float32, 9, 20, 48, False, False, None, None, None),
    ("fp16_skip", torch.float16, 50, 33, 384, True, False, None, None, None),
    ("fp16_skip_bias_wide", torch.float16, 12, 7, 1100, True, True, None, None, None),
    ("fp16_odd_width_one_row_tiles", torch.float16, 30, 11, 300, True, True, (1, 512, 4), None, None),
    # the live count: D = 64 -> BLOCK_R 8, so 21 rows are tiles [0, 8), [8, 16), [16, 21)
    ("fp16_live_0", torch.float16, 30, 21, 64, True, True, None, 0, torch.int32),
    ("fp16_live_mid_tile", torch.float16, 30, 21, 64, True, False, None, 11, torch.int64),
    ("fp32_live_tile_edge", torch.float32, 30, 21, 64, False, True, None, 16, torch.int32),
    ("fp32_live_all", torch.float32, 30, 21, 64, True, True, None, 21, torch.int64),
    ("fp16_live_above_r", torch.float16, 30, 21, 64, True, True, None, 22, torch.int32),  # clamped to R
    ("fp16_live_int64_huge", torch.float16, 30, 21, 64, False, False, None, 2**40, torch.int64),
    ("fp16_live_negative", torch.float16, 30, 21, 64, True, True, None, -5, torch.int32),  # clamped to 0
    ("fp16_live_one_row_tiles", torch.float16, 30, 11, 300, True, True, (1, 512, 4), 4, torch.int64),
]  # no bfloat16: the interpreter rounds float32 -> bfloat16 differently from the GPU (its GPU test covers it)


def _run() -> dict:
    from raggedvit.kernels import _norm_kernel
    from raggedvit.kernels._norm_kernel import NormConfig
    from raggedvit.kernels.gather_layer_norm import _launch_gather_layer_norm, gather_layer_norm_reference

    gen = torch.Generator().manual_seed(0)
    out: dict = {}
    for name, dtype, T, R, D, skip, bias, cfg, last, cu_dtype in CASES:
        x = (torch.randn(T, D, generator=gen) * 2 + 0.5).to(dtype)
        s = torch.randn(T, D, generator=gen).to(dtype) if skip else None
        b = torch.randn(D, generator=gen).to(dtype) if bias else None
        g = (torch.rand(D, generator=gen) + 0.5).to(dtype)
        be = torch.randn(D, generator=gen).to(dtype)
        index = torch.randint(-T, T, (R,), generator=gen)
        index[0], index[-1] = T, -T - 1  # out of range: zero rows
        cu = None if last is None else torch.tensor([0, min(max(last, 0), R) // 2, last], dtype=cu_dtype)
        live = R if last is None else min(max(last, 0), R)
        config = None if cfg is None else NormConfig(*cfg)
        poison = (torch.full((R, D), float("nan"), dtype=dtype), torch.full((R, D), float("nan"), dtype=dtype))
        n, y = _launch_gather_layer_norm(
            x, index, g, be, s, b, 1e-6, cu_seqlens=cu, kernels=_norm_kernel, config=config, out=poison
        )
        rn, ry = gather_layer_norm_reference(x, index, g, be, s, b, 1e-6, cu, compute_dtype=torch.float64)
        eps = torch.finfo(dtype).eps
        # rounding to the dtype (half an ulp) plus the fp32 sums' error (D * 2^-24 relative, tiny slack)
        slack = 0.5 * eps + D * 2.0**-24
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
        n_live, y_live = n[:live].double(), y[:live].double()
        err_n = ((n_live - rn[:live]).abs() / (slack * (rn[:live].abs() + 1.0))).max() if live else torch.zeros(())
        # the sum's operands' scale
        err_y = ((y_live - ry[:live]).abs() / (slack * (ry[:live].abs() + mag[:live]) + 1e-30)).max() if live else 0.0
        zero_rows = [r for r in (0, R - 1) if r < live]
        dead = max([float(n[zero_rows].abs().max()), float(y[zero_rows].abs().max())] if zero_rows else [0.0])
        untouched = bool(n[live:].isnan().all() and y[live:].isnan().all())  # never written: the poison stays
        ref_dead_zero = bool(not rn[live:].any() and not ry[live:].any())  # the reference writes zeros there
        out[name] = {"normed": float(err_n), "summed": float(err_y), "dead": dead, "live": live,
                     "untouched": untouched, "ref_dead_zero": ref_dead_zero}  # fmt: skip
    return out


if __name__ == "__main__":
    json.dump(_run(), sys.stdout)
