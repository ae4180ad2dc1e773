"""Random inputs of the ragged linear tests, and the interpreter run: `python _linear_cases.py` under
TRITON_INTERPRET=1 runs the Triton kernel on CPU tensors for every INTERPRETED case and prints JSON errors (and
whether the dead rows of a NaN-poisoned output that the kernel must not write were left untouched)."""

from __future__ import annotations

import json
import sys

import torch

# (name, dtype, T, K, N, live, activation, bias, residual): live None = no cu_seqlens. The interpreter multiplies
# bfloat16 operands as raw bits, so bf16 runs on the GPU only (tests/kernels/test_linear.py, gpu marker).
INTERPRETED = [
    ("fp16_all_live", torch.float16, 70, 48, 40, None, 0, False, False),
    ("fp16_gelu_bias_res", torch.float16, 70, 48, 40, 65, 1, True, True),
    ("fp16_live_mid_tile", torch.float16, 130, 80, 72, 77, 1, True, False),
    ("fp16_live_zero", torch.float16, 64, 32, 16, 0, 0, True, True),
    ("fp32_bias_res", torch.float32, 33, 24, 20, 20, 0, True, True),
    ("fp32_odd_sizes", torch.float32, 17, 7, 5, 9, 1, True, True),
]
# The persistent TMA kernel (`_ragged_linear_tma`, 32 x 32 x 32 tiles, 3 programs in the
# interpreter), its X's dead rows NaN-poisoned (TMA loads them into the last live tile): K past BLOCK_K's
# multiples, a live count mid-tile, at 0 and past T.
TMA_INTERPRETED = [
    ("tma_fp16_all_live", torch.float16, 70, 48, 40, None, 0, False, False),
    ("tma_fp16_gelu_bias_res", torch.float16, 70, 48, 40, 65, 1, True, True),
    ("tma_fp16_live_mid_tile", torch.float16, 130, 80, 72, 77, 1, True, False),
    ("tma_fp16_live_zero", torch.float16, 64, 32, 16, 0, 0, True, True),
    ("tma_fp16_live_past_t", torch.float16, 70, 64, 48, 90, 0, False, True),
    # the epilogue in two column slices (epilogue_split 2, 32 x 64 x 32 tiles): a slice wholly past
    # N (N = 40), the second tile's right slice past N (N = 72), both slices live (N = 128)
    ("tma_split_fp16_gelu_bias_res", torch.float16, 70, 48, 40, 65, 1, True, True),
    ("tma_split_fp16_live_mid_tile", torch.float16, 130, 80, 72, 77, 1, True, True),
    ("tma_split_fp16_two_tiles", torch.float16, 70, 48, 128, None, 0, True, True),
]


def make(dtype, T, K, N, live, bias, residual, gen, *, cu_dtype=torch.int64, device="cpu"):
    """(x [T, K], weight [N, K], bias [N] | None, residual [T, N] | None, cu [3] | None): cu = [0, live//2, live]."""
    x = torch.randn(T, K, generator=gen)
    w = torch.randn(N, K, generator=gen) / K**0.5
    b = torch.randn(N, generator=gen) if bias else None
    r = torch.randn(T, N, generator=gen) if residual else None
    cu = None if live is None else torch.tensor([0, live // 2, live], dtype=cu_dtype)

    def to(t, dt=dtype):
        return None if t is None else t.to(device=device, dtype=dt)

    return to(x), to(w), to(b), to(r), to(cu, cu_dtype)


def _run_interpreted() -> dict[str, list[float]]:
    from raggedvit.kernels import _linear_kernel
    from raggedvit.kernels._linear_config import LinearConfig, first_unwritten_row
    from raggedvit.kernels._linear_launch import _launch_linear
    from raggedvit.kernels.reference import ragged_linear_reference
    from tests.support.testing import rel_error

    out = {}
    gen = torch.Generator().manual_seed(0)
    for name, dtype, T, K, N, live, act, bias, residual in INTERPRETED + TMA_INTERPRETED:
        x, w, b, r, cu = make(dtype, T, K, N, live, bias, residual, gen)
        tma = name.startswith("tma_")
        ref = ragged_linear_reference(x, w, b, r, cu, act, compute_dtype=torch.float64)
        n = T if live is None else min(live, T)
        if tma:
            x[n:] = float("nan")  # dead rows: whatever the buffer held (read by TMA, reaching no live row)
        poison = torch.full((T, N), float("nan"), dtype=dtype)
        config = None
        if tma:
            split = name.startswith("tma_split_")
            config = LinearConfig(32, 64 if split else 32, 32, 4, 2, tma=True, epilogue_split=2 if split else 1)
        y = _launch_linear(x, w, b, r, cu, act, kernels=_linear_kernel, config=config, out=poison)
        # the pointer kernel never writes a dead row, the TMA kernel none past its last live tile: the poison stays
        untouched = bool(y[n if config is None else first_unwritten_row(config, n) :].isnan().all())
        out[name] = [rel_error(y[:n], ref[:n]) if n else 0.0, float(untouched)]
    return out


if __name__ == "__main__":
    json.dump(_run_interpreted(), sys.stdout)
