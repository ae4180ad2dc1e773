"""Host launcher of the Triton ragged attention kernels (no device reads, no per-call recompiles).

`_launch_triton` is the internal entry: CUDA tensors with the JIT kernels, or CPU tensors with
interpreted kernels (`load_interpreted_kernels()`, or the default ones when the process was started
with TRITON_INTERPRET=1).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import struct
import sys
import warnings
from types import ModuleType
from typing import Any

import torch

from raggedvit.kernels._config import KernelConfig, fwd_grid, pick_config

__all__ = ["_launch_triton", "load_interpreted_kernels", "scale_bits"]

# Compiled kernels per (device, dtype, cu dtype, H, D, store_lse, has_pos, has_key_bias, config), launched without
# Triton's per-call binder. Set RAGGEDVIT_NO_FAST_LAUNCH=1 to always go through JITFunction.run.
_FAST: dict[tuple, tuple[Any, Any]] = {}
try:
    from triton import knobs as _knobs  # Triton >= 3.4: launcher takes all args + knobs hooks

    _FAST_ENABLED = os.environ.get("RAGGEDVIT_NO_FAST_LAUNCH", "0") != "1"
except ImportError:  # pragma: no cover - older Triton: plain JIT launches only
    _knobs = None
    _FAST_ENABLED = False


@functools.lru_cache(maxsize=64)
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


def _unused_f32(out: torch.Tensor) -> torch.Tensor:
    """An fp32 tensor for a pointer the kernel never dereferences (no pos table, no Lse): a view of `out` where
    its bytes allow, else a fresh 1-element tensor. Nothing is cached between calls: a buffer created during
    torch.compile's reduce-overhead warm-up would live in its CUDA-graph pool without being an output."""
    if out.dtype == torch.float32:
        return out
    if out.numel() % 2 == 0 and out.numel() > 0 and out.is_contiguous():
        return out.view(-1).view(torch.float32)
    return torch.empty(1, dtype=torch.float32, device=out.device)


def _launch_triton(
    qkv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    num_heads: int,
    scale: float,
    return_cls_attn: bool,
    *,
    kernels: Any = None,
    config: KernelConfig | None = None,
    out: torch.Tensor | None = None,
    cls_attn: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    pos_table: torch.Tensor | None = None,
    token_pos: torch.Tensor | None = None,
    grid: tuple[int, int] = (0, 0),
    num_prefix: int = 0,
    key_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """qkv [T, 3*H*D] (contiguous), cu_seqlens [B+1] (, bias [3*H*D] qkv's dtype) (, pos_table [H, R] fp32
    contiguous, token_pos [T] cu_seqlens's dtype, grid (grid_h, grid_w), num_prefix: relative position bias)
    (, key_bias [T] fp32 contiguous: added to every logit of its key) -> out [T, H*D], cls_attn [T] fp32 (or [0]).

    Inputs must already be validated; CUDA tensors must be on the current device. `kernels` defaults
    to `raggedvit.kernels._kernel`; `config` defaults to `pick_config(T, D, dtype)` (the benchmark's
    tuner overrides it). `out` [T, H*D] / `cls_attn` [T] fp32 may be preallocated (tests poison them).
    """
    T, width = qkv.shape
    H = num_heads
    D = width // (3 * H)
    B = cu_seqlens.shape[0] - 1
    device = qkv.device
    # pointers we did not allocate must be checked for the 16-byte alignment the fast path was compiled for
    ptrs = qkv.data_ptr() | cu_seqlens.data_ptr()
    has_bias = int(bias is not None)
    if bias is None:
        bias = qkv  # any valid pointer of qkv's type: never read
    else:
        ptrs |= bias.data_ptr()
    if out is None:
        out = torch.empty((T, H * D), dtype=qkv.dtype, device=device)
    else:
        ptrs |= out.data_ptr()
    has_pos = pos_table is not None
    if has_pos:
        ptrs |= pos_table.data_ptr() | token_pos.data_ptr()
    else:  # never read: any valid pointers of the right types
        pos_table, token_pos = _unused_f32(out), cu_seqlens
    has_key_bias = key_bias is not None
    if has_key_bias:
        ptrs |= key_bias.data_ptr()
    else:
        key_bias = pos_table  # never read: an fp32 pointer
    store = int(return_cls_attn)
    if not store:
        cls_attn, lse = torch.empty(0, dtype=torch.float32, device=device), _unused_f32(out)
    else:
        # one allocation for cls_attn [T] and Lse [H, T] (Lse starts 16-byte aligned)
        t_pad = -(-T // 4) * 4
        buf = torch.empty((t_pad + H * T,), dtype=torch.float32, device=device)
        lse = buf[t_pad:]
        if cls_attn is None:
            cls_attn = buf[:T]
        else:
            ptrs |= cls_attn.data_ptr()
    if T == 0:
        return out, cls_attn
    cfg = pick_config(T, D, qkv.dtype) if config is None else config
    bits = scale_bits(scale)
    pos_ints = (int(grid[0]), int(grid[1]), int(num_prefix))  # grid_h, grid_w, num_prefix
    J, grid_m = fwd_grid(T, B, cfg.block_m)
    fwd_args = (
        qkv,
        bias,
        cu_seqlens,
        out,
        lse,
        pos_table,
        token_pos,
        key_bias,
        T,
        B,
        J,
        H,
        D,
        bits,
        store,
        has_bias,
        *pos_ints,
        cfg.block_m,
        cfg.block_n,
        cfg.block_d,
        has_pos,
        has_key_bias,
    )
    cls_args = (qkv, bias, cu_seqlens, lse, cls_attn, pos_table, token_pos, key_bias, T, B, H, D, bits, has_bias,
                *pos_ints, cfg.cls_block_n, cfg.block_d, has_pos, cfg.cls_heads, has_key_bias)  # fmt: skip
    grid_c = -(-T // cfg.cls_block_n)

    key = None
    if kernels is None and config is None and _FAST_ENABLED and qkv.is_cuda and ptrs & 15 == 0:
        # built-in configs are immortal singletons, so their id() is a stable key
        key = (device.index, qkv.dtype, cu_seqlens.dtype, H, D, store, has_pos, has_key_bias, id(cfg))
        fast = _FAST.get(key)
        if fast is not None:
            stream = torch._C._cuda_getCurrentRawStream(device.index)
            try:
                fast[0].launch((grid_m, H, 1), stream, fwd_args)
                if store:
                    fast[1].launch((grid_c, 1, 1), stream, cls_args)
                return out, cls_attn
            except (TypeError, ValueError, AttributeError) as exc:  # launcher convention differs: stop using it
                _disable_fast_launch(exc)
                key = None
    k = _default_kernels() if kernels is None else kernels
    ck_fwd = k._ragged_attn_fwd[(grid_m, H)](
        *fwd_args[:19], BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=cfg.block_d, HAS_POS=has_pos,
        HAS_KEY_BIAS=has_key_bias, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    ck_cls = None
    if store:
        ck_cls = k._ragged_cls_attn[(grid_c,)](
            *cls_args[:17], BLOCK_N=cfg.cls_block_n, BLOCK_D=cfg.block_d, HAS_POS=has_pos, HG=cfg.cls_heads,
            HAS_KEY_BIAS=has_key_bias, num_warps=cfg.cls_num_warps, num_stages=1,
        )  # fmt: skip
    if key is not None and _Compiled.usable(ck_fwd) and (not store or _Compiled.usable(ck_cls)):
        _FAST[key] = (_Compiled(ck_fwd), _Compiled(ck_cls) if store else None)
    return out, cls_attn


def _disable_fast_launch(exc: Exception) -> None:
    global _FAST_ENABLED
    _FAST_ENABLED = False
    _FAST.clear()
    warnings.warn(f"raggedvit: cached Triton launch failed ({exc!r}); using JITFunction launches", stacklevel=3)


class _Compiled:
    """A compiled Triton kernel launched the way JITFunction.run launches it (Triton >= 3.4 convention:
    every signature argument, constexprs included, after the hooks), minus binding and cache lookup."""

    __slots__ = ("kernel", "run", "function", "packed")

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.run = kernel.run
        self.function = kernel.function
        self.packed = kernel.packed_metadata

    @staticmethod
    def usable(kernel: Any) -> bool:
        return all(getattr(kernel, a, None) is not None for a in ("run", "function", "packed_metadata"))

    def launch(self, grid: tuple[int, int, int], stream: int, args: tuple) -> None:
        rt = _knobs.runtime
        enter = rt.launch_enter_hook
        # launch metadata only feeds the hooks; an empty HookChain (Triton >= 3.7) or None needs none
        md = self.kernel.launch_metadata(grid, stream, *args) if getattr(enter, "calls", enter) else None
        self.run(*grid, stream, self.function, self.packed, md, enter, rt.launch_exit_hook, *args)
