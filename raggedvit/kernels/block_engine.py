"""The block engine: one whole pre-norm ViT block on packed rows in one persistent Triton launch.

`vit_block_engine` computes exactly `raggedvit.kernels.reference.vit_block_reference` (the kernel:
`raggedvit.kernels._block_kernel`). CUDA tensors run the JIT kernel on a grid of one program per multiprocessor
(every program co-resident: the phases meet at grid-wide barriers); `sequential=True` runs the same kernel as one
program (every barrier trivially met), and so do CPU tensors, which need a process started with
TRITON_INTERPRET=1 (Triton's interpreter). No host read of device data: the live rows cu[B] are read by the kernel.
"""

from __future__ import annotations

import math
import os
from typing import NamedTuple

import torch

from raggedvit.kernels._block_config import (
    ENGINE_CONFIGS,
    EngineConfig,
    block_c,
    kernel_constexprs,
    max_tiles,
    occupancy,
    workspace_counters,
)
from raggedvit.kernels._config import block_d
from raggedvit.kernels.reference import BlockWeights
from raggedvit.kernels.vit_block import check_block_args

__all__ = [
    "BlockWorkspace",
    "EngineConfig",
    "block_workspace",
    "engine_config",
    "engine_grid",
    "occupancy",
    "vit_block_engine",
]

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
_DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def engine_config(gemm_dtype: torch.dtype) -> EngineConfig:
    """The launch config of a GEMM dtype (`_block_config.ENGINE_CONFIGS`)."""
    return ENGINE_CONFIGS[_DTYPE_NAMES[gemm_dtype]]


class BlockWorkspace(NamedTuple):
    """Scratch of one launch: xn [T, C], qkv [T, 3C], att [T, C], hid [T, F] in the GEMM dtype, x1 [T, C] in the
    stream dtype, lse [H, T] and cls [T] fp32 (one element each without cls_attn), part [S, T, C] fp32 (split-K
    partial tiles, S = the config's largest split) and ctr [`workspace_counters`] int32 (their counters and the grid
    barrier's: zeros, and zeros again after every launch; two launches at once need two workspaces)."""

    xn: torch.Tensor
    qkv: torch.Tensor
    att: torch.Tensor
    hid: torch.Tensor
    x1: torch.Tensor
    lse: torch.Tensor
    cls: torch.Tensor
    part: torch.Tensor
    ctr: torch.Tensor


def block_workspace(
    T: int, C: int, F: int, H: int, stream_dtype: torch.dtype, gemm_dtype: torch.dtype, device: torch.device,
    cls_attn: bool, config: EngineConfig | None = None,
) -> BlockWorkspace:  # fmt: skip
    """Fresh scratch for `vit_block_engine` with `config` (default: engine_config(gemm_dtype)): contents never
    read before the kernel writes them, but for ctr (zeros)."""
    cfg = config or engine_config(gemm_dtype)
    n = T if cls_attn else 1
    split = max(cfg.split_proj, cfg.split_fc2)
    return BlockWorkspace(
        xn=torch.empty(T, C, dtype=gemm_dtype, device=device),
        part=torch.empty(split if split > 1 else 1, T if split > 1 else 1, C, dtype=torch.float32, device=device),
        ctr=torch.zeros(workspace_counters(T, C, cfg), dtype=torch.int32, device=device),
        qkv=torch.empty(T, 3 * C, dtype=gemm_dtype, device=device),
        att=torch.empty(T, C, dtype=gemm_dtype, device=device),
        hid=torch.empty(T, F, dtype=gemm_dtype, device=device),
        x1=torch.empty(T, C, dtype=stream_dtype, device=device),
        lse=torch.empty(H if cls_attn else 1, n, dtype=torch.float32, device=device),
        cls=torch.empty(n, dtype=torch.float32, device=device),
    )


# Resident programs per multiprocessor of each compiled kernel, keyed by (device, launch constexprs).
_OCCUPANCY: dict[tuple, int] = {}


def engine_grid(device: torch.device, sequential: bool, per_sm: int = 1) -> int:
    """Programs of a launch: 1 (sequential, or the interpreter), else per_sm per multiprocessor (per_sm must be at
    most the kernel's occupancy: every program must be resident at once)."""
    if sequential or device.type != "cuda":
        return 1
    return per_sm * torch.cuda.get_device_properties(device).multi_processor_count


def _check(x: torch.Tensor, cu_seqlens: torch.Tensor, w: BlockWeights, num_heads: int) -> tuple[int, int, int]:
    """The op's argument checks (`check_block_args`), then the engine's own limits: contiguous tensors and int32
    offsets -> (T, C, F); errors name the argument and its shape."""
    check_block_args(x, cu_seqlens, w, num_heads)
    T, C = x.shape
    F = w.fc1_weight.shape[0]
    for name in BlockWeights._fields:
        t = getattr(w, name)
        if t is not None and not t.is_contiguous():
            raise ValueError(f"w.{name} {tuple(t.shape)} must be contiguous")
    if not x.is_contiguous() or not cu_seqlens.is_contiguous():
        raise ValueError(f"x {tuple(x.shape)} and cu_seqlens {tuple(cu_seqlens.shape)} must be contiguous")
    if T * max(3 * C, F) >= 2**31:
        raise ValueError(f"x {tuple(x.shape)} with F={F}: T * max(3C, F) must be below 2**31")
    return T, C, F


def vit_block_engine(
    x: torch.Tensor,
    cu_seqlens: torch.Tensor,
    w: BlockWeights,
    num_heads: int,
    *,
    eps: float = 1e-6,
    scale: float | None = None,
    return_cls_attn: bool = False,
    sequential: bool = False,
    phases: tuple[int, int] | None = None,
    workspace: BlockWorkspace | None = None,
    out: torch.Tensor | None = None,
    config: EngineConfig | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """One pre-norm ViT block on packed rows: `vit_block_reference`'s result in one launch.

    Args:
        x: [T, C] packed rows (the residual stream; float16/bfloat16/float32); rows >= cu[B] are dead.
        cu_seqlens: [B+1] int32/int64 on x's device, 0 = cu[0] <= ... <= cu[B] <= T.
        w: the block's parameters (BlockWeights): Linear weights and biases in one GEMM dtype, norms and
            LayerScales in any float dtype, all contiguous on x's device.
        num_heads: H (C = H * D).
        eps: both LayerNorms' epsilon. scale: softmax scale, default 1/sqrt(D).
        return_cls_attn: also return cls_attn [T] float32 (DESIGN.md section 1).
        sequential: one program runs every phase in order (the interpreter always does).
        phases: run phases [lo, hi) of `_block_kernel.PHASES` only (timing one phase: the earlier phases' results
            must already be in `workspace`); None (the default) runs the whole block.
        workspace: scratch from `block_workspace` (reused between calls), or None for fresh scratch.
        out: [T, C] in x's dtype to write y into, or None.
        config: tiles and launch options (default: engine_config of the GEMM dtype; the benchmark sweeps others).

    Returns:
        y [T, C] in x's dtype, zeros on the dead rows (and cls_attn [T] float32).
    """
    from raggedvit.kernels._block_kernel import PHASES, _vit_block

    T, C, F = _check(x, cu_seqlens, w, num_heads)
    H = num_heads
    D = C // H
    if x.device.type != "cuda" and not _INTERPRET:
        raise ValueError(f"x on {x.device}: CPU tensors need a process started with TRITON_INTERPRET=1")
    lo, hi = (0, len(PHASES)) if phases is None else phases
    if not 0 <= lo < hi <= len(PHASES):
        raise ValueError(f"phases must be 0 <= lo < hi <= {len(PHASES)}, got {phases}")
    gemm = w.qkv_weight.dtype
    cfg = config or engine_config(gemm)
    ws = workspace or block_workspace(T, C, F, H, x.dtype, gemm, x.device, return_cls_attn, cfg)
    if return_cls_attn and ws.cls.shape[0] != T:
        raise ValueError(f"workspace.cls {tuple(ws.cls.shape)} must be [T] = [{T}] with return_cls_attn")
    max_split = max(cfg.split_proj, cfg.split_fc2)
    if ws.ctr.shape[0] < workspace_counters(T, C, cfg) or (max_split > 1 and ws.part.shape[:2] != (max_split, T)):
        raise ValueError(f"workspace part {tuple(ws.part.shape)} / ctr {tuple(ws.ctr.shape)} do not fit the config")
    y = torch.empty_like(x) if out is None else out
    B = cu_seqlens.shape[0] - 1
    J = max(1, math.ceil(math.ceil(T / max(B, 1)) / cfg.att_bm))
    qk_scale = (1.0 / math.sqrt(D) if scale is None else scale) * 1.4426950408889634
    consts = kernel_constexprs(
        cfg, block_c(C), block_d(D), w.qkv_weight.element_size(), qkv_bias=w.qkv_bias is not None,
        proj_bias=w.proj_bias is not None, fc1_bias=w.fc1_bias is not None, fc2_bias=w.fc2_bias is not None,
        ls1=w.ls1 is not None, ls2=w.ls2 is not None, cls_attn=return_cls_attn,
    )  # fmt: skip
    key = (str(x.device), x.dtype, gemm, cu_seqlens.dtype, cfg.num_warps, cfg.num_stages, tuple(sorted(consts.items())))
    if sequential or _INTERPRET or x.device.type != "cuda":
        per_sm = 0
    else:  # the first launch of a kernel runs one program per multiprocessor, then its occupancy is known
        per_sm = min(cfg.programs_per_sm, _OCCUPANCY.get(key, 1))
    nprog = engine_grid(x.device, per_sm == 0, per_sm)
    opt = lambda t, alt: t if t is not None else alt  # noqa: E731
    kernel = _vit_block[(nprog,)](
        x, cu_seqlens, w.norm1_weight, w.norm1_bias, w.qkv_weight, opt(w.qkv_bias, w.qkv_weight),
        w.proj_weight, opt(w.proj_bias, w.proj_weight), opt(w.ls1, w.norm1_weight), w.norm2_weight, w.norm2_bias,
        w.fc1_weight, opt(w.fc1_bias, w.fc1_weight), w.fc2_weight, opt(w.fc2_bias, w.fc2_weight),
        opt(w.ls2, w.norm2_weight),
        ws.xn, ws.qkv, ws.att, ws.lse, ws.cls, ws.x1, ws.hid, ws.part, ws.ctr, y,
        T, B, J, C, F, H, D, eps, qk_scale, lo, hi, max_tiles(T, C, cfg), **consts, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )  # fmt: skip
    if key not in _OCCUPANCY and per_sm and hasattr(kernel, "n_regs"):
        _OCCUPANCY[key] = occupancy(int(kernel.n_regs), int(kernel.metadata.shared), cfg.num_warps)
    return (y, ws.cls) if return_cls_attn else y
