"""The patch embedding kernel in the interpreter: `python _embed_cases.py` under TRITON_INTERPRET=1 runs
`_embed_kernel._patch_embed` on CPU tensors and prints JSON: per case the max |error| against the float64 reference
in units of the rounding bound (half a float16 ulp + the float32 sums' K * 2^-24, of |ref| + 1; <= 1 passes)."""

from __future__ import annotations

import json
import sys

import torch

# (name, image dtype, B, C, H, W, patch, P, N, config (block_m, block_n, block_k, num_warps, num_stages) or None)
CASES = [
    ("fp32_cls", torch.float32, 2, 3, 32, 32, 8, 1, 48, None),
    ("fp16_dist_cropped", torch.float16, 3, 3, 30, 37, 7, 2, 32, None),  # K = 147: a partial K tile, crop
    ("fp32_no_prefix", torch.float32, 1, 1, 16, 16, 4, 0, 16, None),
    ("fp32_small_tiles", torch.float32, 5, 3, 16, 16, 4, 3, 40, (16, 16, 16, 4, 1)),  # row / col tiles across images
    ("fp32_no_patches", torch.float32, 2, 3, 5, 9, 8, 1, 16, None),  # only prefix rows
]


def _run() -> dict:
    from raggedvit.kernels import _embed_kernel
    from raggedvit.kernels._embed_kernel import EmbedConfig
    from raggedvit.kernels.patch_embed import _launch_patch_embed, patch_embed_reference

    gen = torch.Generator().manual_seed(0)
    out: dict = {}
    for name, dtype, B, C, H, W, p, P, N, cfg in CASES:
        K, L = C * p * p, (H // p) * (W // p)
        img = (torch.randn(B, C, H, W, generator=gen) * 2).to(dtype)
        w = (torch.randn(K, N, generator=gen) / K**0.5).half()
        pre, pos = torch.randn(P, N, generator=gen), torch.randn(P + L, N, generator=gen)
        config = None if cfg is None else EmbedConfig(*cfg)
        got = _launch_patch_embed(img, w, pre, pos, p, kernels=_embed_kernel, config=config)
        ref = patch_embed_reference(img, w, pre, pos, p, compute_dtype=torch.float64)
        bound = (0.5 * torch.finfo(torch.float16).eps + K * 2.0**-24) * (ref.abs() + 1.0)
        out[name] = {"error": float(((got.double() - ref).abs() / bound).max()) if got.numel() else 0.0,
                     "shape": list(got.shape)}  # fmt: skip
    return out


if __name__ == "__main__":
    json.dump(_run(), sys.stdout)
