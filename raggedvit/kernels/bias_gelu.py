"""Bias + GELU (erf form) as one pass: the kernel of `com.raggedvit::BiasGelu` (exporter rules `bias_gelu` and
`zero_bias_gelu`, raggedvit/exporter/rules/).

`bias_gelu(x, bias)` = GELU(x + bias) with the sum and GELU in fp32 and one rounding: the Triton kernel
`_linear_kernel._bias_gelu` on CUDA tensors, else the torch reference `bias_gelu_reference` (the kernel runs on CPU
tensors through `_linear_launch._launch_bias_gelu` in a process started with TRITON_INTERPRET=1: the tests). The
ONNX op's AOT cubins are the same kernel; its CPU EP kernel computes the same function (DESIGN.md section 2).
"""

from __future__ import annotations

import torch

from raggedvit.kernels._linear_launch import _launch_bias_gelu
from raggedvit.kernels.ragged_linear import _DTYPES, _check_like

__all__ = ["bias_gelu", "bias_gelu_reference"]


def _check(x: torch.Tensor, bias: torch.Tensor | None) -> None:
    if x.dim() < 1:
        raise ValueError(f"x must have at least 1 dimension [..., N], got shape {tuple(x.shape)}")
    if x.dtype not in _DTYPES:
        raise ValueError(f"x dtype must be float16, bfloat16 or float32, got {x.dtype}")
    _check_like("bias", bias, (x.shape[-1],), x, f"x shape {tuple(x.shape)}")


def bias_gelu_reference(
    x: torch.Tensor, bias: torch.Tensor | None = None, compute_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """x [..., N], bias [N] or None -> GELU(x + bias), erf form, computed in compute_dtype (default float32 for
    half inputs, else x's dtype; torch.float64 for a gold reference) and rounded to x's dtype once (kept in float64
    when compute_dtype is float64)."""
    cd = compute_dtype or (torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype)
    s = x.to(cd) if bias is None else x.to(cd) + bias.to(cd)
    y = torch.nn.functional.gelu(s)
    return y if cd == torch.float64 else y.to(x.dtype)


def bias_gelu(x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """GELU(x + bias) (inference only).

    Args:
        x: [..., N] float16 / bfloat16 / float32.
        bias: optional [N] in x's dtype, on x's device.

    Returns:
        y of x's shape and dtype.
    """
    _check(x, bias)
    if x.is_cuda:
        with torch.cuda.device(x.device):
            return _launch_bias_gelu(x.contiguous(), None if bias is None else bias.contiguous())
    return bias_gelu_reference(x, bias)
