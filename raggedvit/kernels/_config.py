"""Launch configurations of the ragged attention kernels, shared by the torch launcher and the AOT build.

One configuration per (dtype, BLOCK_D); T does not change the choice (packed tiles keep the grid
proportional to T, so one config serves both small and large batches). The AOT build compiles
exactly `aot_configs()`; the torch launcher uses `pick_config`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

__all__ = ["KernelConfig", "aot_configs", "block_d", "pick_config"]

_DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


@dataclass(frozen=True)
class KernelConfig:
    """Constexprs and launch options of both kernels for one (dtype, BLOCK_D)."""

    dtype: str  # "fp16" | "bf16" | "fp32"
    block_d: int  # BLOCK_D of both kernels
    block_m: int  # BLOCK_M of _ragged_attn_fwd
    block_n: int  # BLOCK_N of _ragged_attn_fwd
    num_warps: int  # of _ragged_attn_fwd
    num_stages: int  # of _ragged_attn_fwd
    cls_block_n: int  # BLOCK_N of _ragged_cls_attn
    cls_num_warps: int  # of _ragged_cls_attn (num_stages 1)

    def as_dict(self) -> dict[str, int | str]:
        return asdict(self)


def block_d(D: int) -> int:
    """BLOCK_D = next power of two >= D, at least 16 (tl.dot needs K >= 16)."""
    if D < 1:
        raise ValueError(f"head dim must be >= 1, got {D}")
    return max(16, 1 << (D - 1).bit_length())


def _make(dtype: str, bd: int) -> KernelConfig:
    half = dtype != "fp32"
    if bd <= 64:
        bm, bn, warps, stages = (64, 64, 4, 3) if half else (64, 32, 4, 2)
    elif bd == 128:
        bm, bn, warps, stages = (64, 64, 4, 2) if half else (32, 32, 4, 2)
    else:  # 256
        bm, bn, warps, stages = (64, 32, 8, 2) if half else (32, 16, 4, 1)
    cls_bn = max(16, min(128, 8192 // bd))
    return KernelConfig(dtype, bd, bm, bn, warps, stages, cls_bn, 4)


_CONFIGS: dict[tuple[str, int], KernelConfig] = {
    (dt, bd): _make(dt, bd) for dt in ("fp16", "bf16", "fp32") for bd in (16, 32, 64, 128, 256)
}


def pick_config(T: int, D: int, dtype: torch.dtype | str) -> KernelConfig:
    """Config for head dim D (1..256) and dtype; T is accepted for future shape-dependent choices."""
    name = dtype if isinstance(dtype, str) else _DTYPE_NAMES.get(dtype)
    bd = block_d(D)
    if name is None or (name, bd) not in _CONFIGS:
        raise ValueError(f"no kernel config for dtype={dtype}, D={D} (BLOCK_D={bd})")
    return _CONFIGS[(name, bd)]


def aot_configs(block_ds: tuple[int, ...] = (32, 64, 128)) -> list[KernelConfig]:
    """Configs the AOT build compiles: every dtype x BLOCK_D in `block_ds` (DESIGN: D % 16 == 0, 32..128)."""
    return [_CONFIGS[(dt, bd)] for dt in ("fp16", "bf16", "fp32") for bd in block_ds]
