"""Row gather + residual sum + LayerNorm as one pass: the kernel of `com.raggedvit::GatherLayerNorm` (exporter
rules `ragged_linear_skip_layer_norm`, `gather_layer_norm` and `layer_norm_rows`, raggedvit/exporter/rules/).

`gather_layer_norm(x, index, gamma, beta, skip, bias, eps, cu_seqlens=)` gathers rows i = index[r] of x (+ skip,
+ bias, summed in fp32) and returns (LayerNorm of the fp32 sum, the sum rounded to x's dtype) for the live output
rows r < live = clamp(cu_seqlens[B], 0, R) (every row without cu_seqlens: the capacity layout's device-side count,
DESIGN.md section 4, as RaggedLinear's); the dead rows are unspecified (the Triton kernel never writes them, the
reference writes zeros). The Triton kernel `_norm_kernel._gather_layer_norm` runs on CUDA tensors, else the torch
reference `gather_layer_norm_reference` (the kernel runs on CPU tensors through `_launch_gather_layer_norm` in a
process started with TRITON_INTERPRET=1: the tests). The ONNX op's AOT cubins are the same kernel; its CPU EP
kernel computes the same function (zeros in the dead rows).
"""

from __future__ import annotations

from types import ModuleType

import torch

from raggedvit.kernels._norm_kernel import NormConfig, norm_config
from raggedvit.kernels.ragged_linear import _CU_DTYPES, _DTYPES, _check_like

__all__ = ["gather_layer_norm", "gather_layer_norm_reference"]


def _check(
    x: torch.Tensor,
    index: torch.Tensor,
    gamma: torch.Tensor | None,
    beta: torch.Tensor | None,
    skip: torch.Tensor | None,
    bias: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None = None,
) -> None:
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [T, D], got shape {tuple(x.shape)}")
    if x.dtype not in _DTYPES:
        raise ValueError(f"x dtype must be float16, bfloat16 or float32, got {x.dtype}")
    if index.dim() != 1 or index.dtype != torch.int64 or index.device != x.device:
        raise ValueError(f"index must be 1-D int64 on x's device, got {index.dtype} {tuple(index.shape)}")
    where = f"x shape {tuple(x.shape)}"
    D = x.shape[1]
    for name, t, shape in (("gamma", gamma, (D,)), ("beta", beta, (D,)), ("skip", skip, tuple(x.shape)),
                           ("bias", bias, (D,))):  # fmt: skip
        _check_like(name, t, shape, x, where)
    if gamma is None or beta is None:
        raise ValueError("gamma and beta are required")
    if cu_seqlens is not None:
        if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 1:
            raise ValueError(f"cu_seqlens must be 1-D [B+1] with B >= 0, got shape {tuple(cu_seqlens.shape)}")
        if cu_seqlens.dtype not in _CU_DTYPES:
            raise ValueError(f"cu_seqlens dtype must be int32 or int64, got {cu_seqlens.dtype}")
        if cu_seqlens.device != x.device:
            raise ValueError(f"cu_seqlens is on {cu_seqlens.device} but x is on {x.device}")


def gather_layer_norm_reference(
    x: torch.Tensor,
    index: torch.Tensor,
    gamma: torch.Tensor,
    beta: torch.Tensor,
    skip: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    cu_seqlens: torch.Tensor | None = None,
    compute_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, D], index [R] int64, gamma / beta / bias [D], skip [T, D], cu_seqlens [B+1] int32 / int64 ->
    (normed [R, D], summed [R, D]) in x's dtype (kept in compute_dtype when it is float64): s = x[i] + skip[i] + bias
    in compute_dtype (i < 0 counts from the end; i outside [-T, T) gives zero rows), normed = LayerNorm(s) * gamma +
    beta (biased variance), for the rows r < live = clamp(cu_seqlens[B], 0, R) (R without cu_seqlens); zero rows
    past live (the op leaves them unspecified). Reads cu_seqlens[B] on the host."""
    T, D = x.shape
    R = index.shape[0]
    i = torch.where(index < 0, index + T, index)
    valid = (i >= 0) & (i < T)
    if cu_seqlens is not None:
        live = min(max(int(cu_seqlens[-1]), 0), R)
        valid = valid & (torch.arange(R, device=index.device) < live)
    src = torch.where(valid, i, torch.zeros_like(i))
    pad = torch.zeros((1, D), dtype=compute_dtype, device=x.device)  # row 0 of an empty X: every index is invalid
    s = (x.to(compute_dtype) if T else pad)[src]
    if skip is not None:
        s = s + (skip.to(compute_dtype) if T else pad)[src]
    if bias is not None:
        s = s + bias.to(compute_dtype)
    n = torch.nn.functional.layer_norm(s, (D,), gamma.to(compute_dtype), beta.to(compute_dtype), eps)
    keep = valid[:, None]
    s, n = torch.where(keep, s, 0.0), torch.where(keep, n, 0.0)
    if compute_dtype == torch.float64:
        return n, s
    return n.to(x.dtype), s.to(x.dtype)


def _default_kernels() -> ModuleType:
    from raggedvit.kernels import _norm_kernel

    return _norm_kernel


def _launch_gather_layer_norm(
    x: torch.Tensor,
    index: torch.Tensor,
    gamma: torch.Tensor,
    beta: torch.Tensor,
    skip: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    *,
    cu_seqlens: torch.Tensor | None = None,
    kernels: ModuleType | None = None,
    config: NormConfig | None = None,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validated, contiguous tensors (CUDA on the current device, or CPU under TRITON_INTERPRET=1) -> (normed,
    summed) [R, D]; rows past clamp(cu_seqlens[B], 0, R) are never written. `config` defaults to `norm_config(D)`
    (D <= 4096); `out` (normed, summed) may be preallocated (tests poison them)."""
    T, D = x.shape
    R = index.shape[0]
    if out is None:
        out = (torch.empty((R, D), dtype=x.dtype, device=x.device), torch.empty((R, D), dtype=x.dtype, device=x.device))
    normed, summed = out
    if R == 0 or D == 0:
        return normed, summed
    cfg = norm_config(D) if config is None else config
    if cfg is None:
        raise ValueError(f"rows of D = {D} columns exceed the kernel's 4096")
    k = _default_kernels() if kernels is None else kernels
    grid = (-(-R // cfg.block_r),)
    has_live = cu_seqlens is not None
    # pointers the kernel never dereferences: any valid tensor of the expected type
    cu = cu_seqlens if has_live else torch.zeros(1, dtype=torch.int32, device=x.device)
    k._gather_layer_norm[grid](
        x, x if skip is None else skip, x if bias is None else bias, index, gamma, beta, cu, normed, summed,
        T, R, D, cu.shape[0] - 1, float(eps), int(skip is not None), int(bias is not None), int(has_live),
        BLOCK_R=cfg.block_r, BLOCK_D=cfg.block_d, num_warps=cfg.num_warps,
    )  # fmt: skip
    return normed, summed


def gather_layer_norm(
    x: torch.Tensor,
    index: torch.Tensor,
    gamma: torch.Tensor,
    beta: torch.Tensor,
    skip: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """LayerNorm of gathered rows plus a residual, over the live rows (inference only).

    Args:
        x: [T, D] float16 / bfloat16 / float32 (the residual stream).
        index: [R] int64, rows of x to gather (negative: from the end; outside [-T, T): zero rows).
        gamma, beta: [D] in x's dtype (the LayerNorm's weight and bias).
        skip: optional [T, D] in x's dtype, added to x before the gather (the block's branch output).
        bias: optional [D] in x's dtype, added too (the branch's bias).
        eps: the LayerNorm's epsilon.
        cu_seqlens: optional [B+1] int32 / int64 on x's device: live = clamp(cu_seqlens[B], 0, R) output rows (R
            without it). Never read on the host by the CUDA path.

    Returns:
        (normed [R, D], summed [R, D]) in x's dtype: the LayerNorm of the fp32 sum, and the sum rounded once, in
        the live rows; the dead rows r >= live are unspecified (CUDA: never written; CPU: zero).
    """
    _check(x, index, gamma, beta, skip, bias, cu_seqlens)
    if x.is_cuda:
        c = [None if t is None else t.contiguous() for t in (x, index, gamma, beta, skip, bias, cu_seqlens)]
        with torch.cuda.device(x.device):
            return _launch_gather_layer_norm(*c[:6], eps, cu_seqlens=c[6])  # type: ignore[arg-type]
    return gather_layer_norm_reference(x, index, gamma, beta, skip, bias, eps, cu_seqlens)
