"""Public ragged linear layer: a Linear (+ bias, GELU, residual) over the live rows of a packed layout only.

In the capacity layout (DESIGN.md section 4) rows [cu[B], T) are dead; this op reads the live count cu[B] on the
device and computes the live rows only (the Triton kernel never touches a dead row; the CPU path writes zeros there),
with the bias, GELU and residual add fused into the GEMM's epilogue (one rounding of an fp32 accumulator).
"""

from __future__ import annotations

import torch

from raggedvit.kernels._linear_op import ragged_linear_cuda, ragged_linear_op
from raggedvit.kernels.reference import ragged_linear_reference

__all__ = ["ACTIVATIONS", "ragged_linear"]

ACTIVATIONS = {"none": 0, "gelu": 1}  # the op's `activation` codes (GELU: the erf form, nn.GELU's default)
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_CU_DTYPES = (torch.int32, torch.int64)


def _check_like(name: str, t: torch.Tensor | None, shape: tuple[int, ...], x: torch.Tensor, what: str) -> None:
    if t is not None and (tuple(t.shape) != shape or t.dtype != x.dtype or t.device != x.device):
        raise ValueError(
            f"{name} must be {list(shape)} {x.dtype} on {x.device} ({what}), "
            f"got {tuple(t.shape)} {t.dtype} on {t.device}"
        )


def _check(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    activation: int,
) -> None:
    """Validate shapes, dtypes and devices (never reads tensor data)."""
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [T, K], got shape {tuple(x.shape)}")
    if x.dtype not in _DTYPES:
        raise ValueError(f"x dtype must be float16, bfloat16 or float32, got {x.dtype}")
    T, K = x.shape
    if weight.dim() != 2 or weight.shape[1] != K:
        raise ValueError(f"weight must be [N, K={K}] (x shape {tuple(x.shape)}), got shape {tuple(weight.shape)}")
    _check_like("weight", weight, tuple(weight.shape), x, f"x shape {tuple(x.shape)}")
    N = weight.shape[0]
    _check_like("bias", bias, (N,), x, f"weight shape {tuple(weight.shape)}")
    _check_like("residual", residual, (T, N), x, f"x shape {tuple(x.shape)}, weight shape {tuple(weight.shape)}")
    if cu_seqlens is not None:
        if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 1:
            raise ValueError(f"cu_seqlens must be 1-D [B+1] with B >= 0, got shape {tuple(cu_seqlens.shape)}")
        if cu_seqlens.dtype not in _CU_DTYPES:
            raise ValueError(f"cu_seqlens dtype must be int32 or int64, got {cu_seqlens.dtype}")
        if cu_seqlens.device != x.device:
            raise ValueError(f"cu_seqlens is on {cu_seqlens.device} but x is on {x.device}")
    if activation not in ACTIVATIONS.values():
        raise ValueError(f"activation must be 0 (none) or 1 (GELU, erf), got {activation!r}")


def ragged_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    activation: int = 0,
) -> torch.Tensor:
    """y[r] = act(x[r] @ weight^T + bias) + residual[r] for the live rows; the dead rows are unspecified (CUDA
    float16 / bfloat16: never written, but for the last live tile's under the TMA kernel; CPU and float32: zero).
    Inference only.

    Args:
        x: [T, K] float16/bfloat16/float32.
        weight: [N, K] in x's dtype (nn.Linear's layout).
        bias: optional [N] in x's dtype.
        residual: optional [T, N] in x's dtype, added after the activation.
        cu_seqlens: optional [B+1] int32/int64 on x's device; live = clamp(cu[B], 0, T) (T without it). Never read
            on the host.
        activation: 0 none, 1 GELU (erf) (ACTIVATIONS).

    Returns:
        y [T, N] in x's dtype, computed with float32 accumulation and rounded once.

    Eager CUDA tensors launch the Triton kernel directly (float32: torch math); CPU tensors run the torch reference
    math; under torch.compile / torch.export (or with fake/functional tensors) the call goes through
    `torch.ops.raggedvit.ragged_linear`.
    """
    activation = int(activation)
    _check(x, weight, bias, residual, cu_seqlens, activation)
    tensors = (x, weight, bias, residual, cu_seqlens)
    if torch.compiler.is_compiling() or any(t is not None and type(t) is not torch.Tensor for t in tensors):
        return ragged_linear_op(x, weight, bias, residual, cu_seqlens, activation)
    if x.is_cuda:
        return ragged_linear_cuda(x, weight, bias, residual, cu_seqlens, activation)
    return ragged_linear_reference(x, weight, bias, residual, cu_seqlens, activation)
