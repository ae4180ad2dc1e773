"""Host launcher of the Triton ragged attention kernels (no device reads, no per-call recompiles).

`_launch_triton` is the internal entry: CUDA tensors with the JIT kernels, or CPU tensors with
interpreted kernels (`load_interpreted_kernels()`, or the default ones when the process was started
with TRITON_INTERPRET=1).
"""

from __future__ import annotations

import importlib.util
import os
import struct
import sys
from types import ModuleType
from typing import Any

import torch

from raggedvit.kernels._config import KernelConfig, pick_config

__all__ = ["_launch_triton", "load_interpreted_kernels", "scale_bits"]

_EMPTY_CLS: dict[torch.device, torch.Tensor] = {}


def scale_bits(scale: float) -> int:
    """IEEE-754 bits of float32(scale) as a signed int32 (the kernels' `scale_bits`)."""
    return struct.unpack("<i", struct.pack("<f", scale))[0]


def _default_kernels() -> ModuleType:
    from raggedvit.kernels import _kernel

    return _kernel


def load_interpreted_kernels() -> ModuleType:
    """A private copy of `_kernel.py` decorated under TRITON_INTERPRET=1 (runs on CPU tensors).

    Triton picks interpreter vs compiler when a kernel is decorated, so the copy is loaded with the
    variable set whatever the process environment; the normal kernels stay untouched.
    """
    name = "raggedvit.kernels._kernel_interpreted"
    if name in sys.modules:
        return sys.modules[name]
    try:  # triton >= 3.8 imports gluon lazily while interpreting, which asserts on patched tl functions
        import triton.experimental.gluon  # noqa: F401
    except ImportError:
        pass
    path = os.path.join(os.path.dirname(__file__), "_kernel.py")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        spec.loader.exec_module(module)
    finally:
        if old is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = old
    sys.modules[name] = module
    return module


def _empty_cls(device: torch.device) -> torch.Tensor:
    t = _EMPTY_CLS.get(device)
    if t is None:
        t = _EMPTY_CLS[device] = torch.empty(0, dtype=torch.float32, device=device)
    return t


def _launch_triton(
    qkv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    num_heads: int,
    scale: float,
    return_cls_attn: bool,
    *,
    kernels: Any = None,
    config: KernelConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """qkv [T, 3*H*D] (contiguous), cu_seqlens [B+1] -> out [T, H*D], cls_attn [T] fp32 (or [0]).

    Inputs must already be validated. `kernels` defaults to `raggedvit.kernels._kernel`;
    `config` defaults to `pick_config(T, D, dtype)` (the benchmark's tuner overrides it).
    """
    T, width = qkv.shape
    H = num_heads
    D = width // (3 * H)
    B = cu_seqlens.shape[0] - 1
    out = torch.empty((T, H * D), dtype=qkv.dtype, device=qkv.device)
    if not return_cls_attn:
        cls_attn = _empty_cls(qkv.device)
    else:
        cls_attn = torch.empty((T,), dtype=torch.float32, device=qkv.device)
    if T == 0:
        return out, cls_attn
    k = _default_kernels() if kernels is None else kernels
    cfg = pick_config(T, D, qkv.dtype) if config is None else config
    bits = scale_bits(scale)
    lse = torch.empty((H, T), dtype=torch.float32, device=qkv.device) if return_cls_attn else cls_attn
    grid = (triton_cdiv(T, cfg.block_m), H)
    k._ragged_attn_fwd[grid](
        qkv, cu_seqlens, out, lse, T, B, H, D, bits, int(return_cls_attn),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=cfg.block_d,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    if return_cls_attn:
        k._ragged_cls_attn[(triton_cdiv(T, cfg.cls_block_n),)](
            qkv, cu_seqlens, lse, cls_attn, T, B, H, D, bits,
            BLOCK_N=cfg.cls_block_n, BLOCK_D=cfg.block_d, num_warps=cfg.cls_num_warps, num_stages=1,
        )  # fmt: skip
    return out, cls_attn


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)
