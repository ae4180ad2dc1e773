"""`torch.ops.raggedvit.ragged_linear`: the custom op seen by torch.compile / torch.export.

Schema: (x [T, K], weight [N, K], bias [N] or None, residual [T, N] or None, cu_seqlens [B+1] int32/int64 or None,
         activation 0 none / 1 GELU (erf)) -> y [T, N] in x's dtype; rows r >= clamp(cu[B], 0, T) are dead: unspecified
         (the Triton kernels write none past the last live tile; the torch math writes zeros).
CPU: the torch reference math (float32 arithmetic for half inputs, one rounding). CUDA: the Triton kernel for
float16 / bfloat16; float32 runs the torch math (the kernel's ieee fp32 dots lose to cuBLAS, and the ONNX CUDA EP
has no fp32 kernel either). The fake implementation reads shapes only (T may be unbacked, e.g. from nonzero).
"""

from __future__ import annotations

import torch

from raggedvit.kernels._linear_launch import _launch_linear
from raggedvit.kernels.reference import ragged_linear_reference

__all__ = ["ragged_linear_cuda", "ragged_linear_op"]


def ragged_linear_cuda(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    activation: int,
) -> torch.Tensor:
    """The CUDA implementation on validated tensors (any current device)."""
    if x.dtype == torch.float32:
        return ragged_linear_reference(x, weight, bias, residual, cu_seqlens, activation)
    args = [t if t is None else t.contiguous() for t in (x, weight, bias, residual, cu_seqlens)]
    if x.get_device() == torch.cuda.current_device():
        return _launch_linear(*args, activation)
    with torch.cuda.device(x.device):
        return _launch_linear(*args, activation)


@torch.library.custom_op("raggedvit::ragged_linear", mutates_args=())
def ragged_linear_op(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    activation: int = 0,
) -> torch.Tensor:
    raise NotImplementedError(f"raggedvit::ragged_linear has no kernel for device {x.device}")


@ragged_linear_op.register_kernel("cpu")
def _cpu_kernel(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    activation: int = 0,
) -> torch.Tensor:
    return ragged_linear_reference(x, weight, bias, residual, cu_seqlens, activation)


@ragged_linear_op.register_kernel("cuda")
def _cuda_kernel(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    activation: int = 0,
) -> torch.Tensor:
    return ragged_linear_cuda(x, weight, bias, residual, cu_seqlens, activation)


@ragged_linear_op.register_fake
def _fake(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    activation: int = 0,
) -> torch.Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]))
