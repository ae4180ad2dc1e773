"""Host launcher of the Triton ragged linear kernel (`_linear_kernel._ragged_linear`): no device reads.

`_launch_linear` takes validated, contiguous tensors: CUDA tensors with the JIT kernel, or CPU tensors in a process
started with TRITON_INTERPRET=1 (the kernel calls tl.standard's JIT helpers, e.g. tl.cdiv, so a private copy
decorated later, as `_launch.load_interpreted_kernels` makes of the attention kernels, does not run). The
interpreter multiplies bfloat16 operands as raw bits: interpreted bf16 results are wrong (GPU runs are not).
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from types import ModuleType

import torch

from raggedvit.kernels._linear_config import GeluConfig, LinearConfig, gelu_config, linear_config

__all__ = ["_launch_bias_gelu", "_launch_linear", "tma_ready"]

INTERPRETER_PROGRAMS = 3  # persistent programs of the TMA kernel in the interpreter (no SM count there)


def tma_ready(x: torch.Tensor, weight: torch.Tensor, *others: torch.Tensor | None) -> bool:
    """Whether TMA descriptors can address x [T, K], weight [N, K] and the [T, N] tensors `others` (residual, out;
    None: absent): fp16 / bf16, 16-byte aligned bases and rows (K and N * 2 bytes multiples of 16)."""
    K, N = x.shape[1], weight.shape[0]
    tensors = [x, weight, *(t for t in others if t is not None)]
    return (
        x.dtype in (torch.float16, torch.bfloat16)
        and all(t.dtype == x.dtype and t.data_ptr() % 16 == 0 for t in tensors)
        and (K * x.element_size()) % 16 == 0
        and (N * x.element_size()) % 16 == 0
    )


@cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _multiprocessors(device: torch.device) -> int:
    """Streaming multiprocessors of `device` (the persistent TMA grid is a multiple of them; the interpreter: a
    fixed count)."""
    if device.type != "cuda":
        return INTERPRETER_PROGRAMS
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def _default_kernels() -> ModuleType:
    from raggedvit.kernels import _linear_kernel

    return _linear_kernel


def _launch_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    activation: int,
    *,
    kernels: ModuleType | None = None,
    config: LinearConfig | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [T, K], weight [N, K], bias [N] or None, residual [T, N] or None (all contiguous, one dtype),
    cu_seqlens [B+1] int32/int64 or None -> y [T, N] in x's dtype: rows past live = clamp(cu[B], 0, T) hold
    unspecified values (the pointer kernel never writes them; the TMA kernel writes those of the last live tile).

    CUDA tensors must be on the current device. `config` defaults to `linear_config(T, N, arch of x's device,
    has_live)`; `out` [T, N] may be preallocated (tests poison it)."""
    T, K = x.shape
    N = weight.shape[0]
    if out is None:
        out = torch.empty((T, N), dtype=x.dtype, device=x.device)
    if T == 0 or N == 0:
        return out
    has_live = cu_seqlens is not None
    # pointers the kernel never dereferences: any valid tensor of the expected type
    cu = cu_seqlens if has_live else torch.zeros(1, dtype=torch.int32, device=x.device)
    B = cu.shape[0] - 1 if has_live else 0
    if config is None:
        arch = None
        if x.is_cuda:
            major, minor = torch.cuda.get_device_capability(x.device)
            arch = 10 * major + minor
        config = linear_config(T, N, arch, has_live)
    cfg = config
    k = _default_kernels() if kernels is None else kernels
    tiles = -(-T // cfg.block_m) * -(-N // cfg.block_n)
    if cfg.tma and tma_ready(x, weight, residual, out):
        from triton.tools.tensor_descriptor import TensorDescriptor

        programs = min(cfg.programs_per_sm * _multiprocessors(x.device), tiles)
        x_desc = TensorDescriptor(x, [T, K], [K, 1], [cfg.block_m, cfg.block_k])
        w_desc = TensorDescriptor(weight, [N, K], [K, 1], [cfg.block_n, cfg.block_k])
        slice_n = cfg.block_n // cfg.epilogue_split  # the epilogue's store width
        y_desc = TensorDescriptor(out, [T, N], [N, 1], [cfg.block_m, slice_n])
        res = residual if residual is not None else out  # never read when has_res = 0
        res_desc = TensorDescriptor(res, [T, N], [N, 1], [cfg.block_m, slice_n])
        k._ragged_linear_tma[(programs,)](
            x_desc, w_desc, res_desc, y_desc, x if bias is None else bias, cu,
            T, N, K, B, int(bias is not None), int(residual is not None), int(has_live), int(activation), programs,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
            EPI_SPLIT=cfg.epilogue_split, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip
        return out
    if cfg.tma:  # operands TMA cannot address: the pointer kernel with the same tiles
        cfg = replace(cfg, tma=False)
    grid = (tiles,)
    k._ragged_linear[grid](
        x, weight, x if bias is None else bias, x if residual is None else residual, cu, out,
        T, N, K, B, int(bias is not None), int(residual is not None), int(has_live), int(activation),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return out


def _launch_bias_gelu(
    x: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    kernels: ModuleType | None = None,
    config: GeluConfig | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [..., N] contiguous, bias [N] in x's dtype or None -> GELU(x + bias) in x's dtype (`_bias_gelu`).

    CUDA tensors must be on the current device; `config` defaults to `gelu_config(M)`, M = x.numel() // N."""
    N = x.shape[-1] if x.dim() else 1
    M = x.numel() // N if N else 0
    if out is None:
        out = torch.empty_like(x)
    if M == 0 or N == 0:
        return out
    cfg = gelu_config(M) if config is None else config
    grid = (-(-M // cfg.block_m) * -(-N // cfg.block_n),)
    k = _default_kernels() if kernels is None else kernels
    k._bias_gelu[grid](
        x, x if bias is None else bias, out, M, N, int(bias is not None),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
    )  # fmt: skip
    return out
