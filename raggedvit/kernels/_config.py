"""Launch configurations of the ragged attention kernels, shared by the torch launcher and the AOT build.

For every (dtype, BLOCK_D) there are two configs, told apart by `min_tokens`: the launcher uses the
config with the largest min_tokens <= T. Small T (< SMALL_T_LIMIT packed rows) gets 32-row query tiles
so more programs run at small batch; large T gets 64-row tiles (tensor-core friendly, and short
enough that tiles straddling two sequences waste little). The AOT build compiles exactly
`aot_configs()` and must apply the same rule (`pick_config` is the reference implementation).
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import torch

__all__ = [
    "DEAD_TILES_PER_PROGRAM",
    "SMALL_T_LIMIT",
    "KernelConfig",
    "aot_configs",
    "block_d",
    "fwd_grid",
    "pick_config",
]

SMALL_T_LIMIT = 2048  # T below this uses the min_tokens=0 config

_DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


@dataclass(frozen=True)
class KernelConfig:
    """Constexprs and launch options of both kernels for one (dtype, BLOCK_D, T range)."""

    dtype: str  # "fp16" | "bf16" | "fp32"
    block_d: int  # BLOCK_D of both kernels
    block_m: int  # BLOCK_M of _ragged_attn_fwd
    block_n: int  # BLOCK_N of _ragged_attn_fwd
    num_warps: int  # of _ragged_attn_fwd
    num_stages: int  # of _ragged_attn_fwd
    cls_block_n: int  # BLOCK_N of _ragged_cls_attn
    cls_num_warps: int  # of _ragged_cls_attn (num_stages 1)
    min_tokens: int = 0  # used for T >= min_tokens (the largest such config wins)
    cls_heads: int = 4  # HG of _ragged_cls_attn: heads per [cls_block_n, HG, BLOCK_D] tile

    def as_dict(self) -> dict[str, int | str]:
        return asdict(self)


def block_d(D: int) -> int:
    """BLOCK_D = next power of two >= D, at least 16 (tl.dot needs K >= 16)."""
    if D < 1:
        raise ValueError(f"head dim must be >= 1, got {D}")
    return max(16, 1 << (D - 1).bit_length())


# Measured overrides (paste the table printed by `python3 -m benchmarks.kernel --tune` here):
# (dtype, BLOCK_D, "small" | "large") -> (block_m, block_n, num_warps, num_stages[, cls_block_n, cls_num_warps])
_TUNED: dict[tuple[str, int, str], tuple[int, ...]] = {}


def _make(dtype: str, bd: int, small: bool) -> KernelConfig:
    # fp16/bf16: wgmma/mma tiles with cp.async multi-buffering; fp32 (ieee FMA dots): small tiles, no spills
    if dtype == "fp32":
        bm, bn, warps, stages = (32, 16, 4, 1) if bd == 256 else (32, 16 if bd == 128 else 32, 4, 2)
    elif bd <= 64:
        bm, bn, warps, stages = 64, 64, 4, 3
    elif bd == 128:
        bm, bn, warps, stages = 64, 64, 4, 2
    else:  # 256
        bm, bn, warps, stages = 64, 32, 8, 2
    if small:
        if dtype == "fp32":
            bm = min(bm, 32)
    elif dtype != "fp32" and bd <= 64:
        bn = 32  # the tune's best key tile for fp16/bf16 with D <= 64 (docs/decisions.md)
    # the cls kernel loads [cls_bn, cls_heads, bd] tiles (`_kernel._ragged_cls_attn`). From SMALL_T_LIMIT rows
    # fp16 / bf16 take 4 heads x 16 columns a program: 1024 // bd = 16 heads left ten of sixteen slots masked off at
    # deit_small's H = 6 (89 registers a thread, 31% occupancy), and fewer, larger programs each wait once on their
    # chain of dependent loads (CU, then the sequence's first row and its Lse): the best or close to it among 4 / 8 /
    # 16 heads x 8 / 16 columns at deit's H = 6 / 12. Below SMALL_T_LIMIT (B = 1: 197 rows) and in fp32: 16 heads
    # (1024 // bd) x 4 columns (4 heads would take deit_base's H = 12 three passes). Figures: docs/decisions.md.
    large = not small and dtype != "fp32"
    cls_bn, cls_warps, cls_heads = (16, 4, 4) if large else (4, 4, 1024 // bd)
    tuned = _TUNED.get((dtype, bd, "small" if small else "large"))
    if tuned is not None:
        bm, bn, warps, stages = tuned[:4]
        if len(tuned) > 4:
            cls_bn, cls_warps = tuned[4:]
    return KernelConfig(dtype, bd, bm, bn, warps, stages, cls_bn, cls_warps, 0 if small else SMALL_T_LIMIT,
                        cls_heads=cls_heads)  # fmt: skip


_CONFIGS: dict[tuple[str, int], tuple[KernelConfig, KernelConfig]] = {
    (dt, bd): (_make(dt, bd, True), _make(dt, bd, False))
    for dt in ("fp16", "bf16", "fp32")
    for bd in (16, 32, 64, 128, 256)
}


@functools.lru_cache(maxsize=256)
def _lookup(D: int, dtype: torch.dtype | str) -> tuple[KernelConfig, KernelConfig]:
    name = dtype if isinstance(dtype, str) else _DTYPE_NAMES.get(dtype)
    bd = block_d(D)
    if name is None or (name, bd) not in _CONFIGS:
        raise ValueError(f"no kernel config for dtype={dtype}, D={D} (BLOCK_D={bd})")
    return _CONFIGS[(name, bd)]


def pick_config(T: int, D: int, dtype: torch.dtype | str) -> KernelConfig:
    """Config for T packed rows, head dim D (1..256) and dtype (torch dtype or "fp16"/"bf16"/"fp32")."""
    small, large = _lookup(D, dtype)
    return large if T >= large.min_tokens else small


DEAD_TILES_PER_PROGRAM = 4  # dead-row tiles zeroed per program of the forward kernel (at most)


def fwd_grid(T: int, B: int, block_m: int) -> tuple[int, int]:
    """(J, programs along x) of the forward kernel for T >= 1 rows and B sequences: J = cdiv(cdiv(T, B), block_m)
    programs per sequence (a sequence of at most J * block_m rows gets one tile per program; longer ones loop), then
    cdiv(T, DEAD_TILES_PER_PROGRAM * block_m) programs for the dead rows. The C++ launcher uses the same rule."""
    per_seq = -(-T // max(B, 1))
    J = max(1, -(-per_seq // block_m))
    return J, B * J + -(-T // (DEAD_TILES_PER_PROGRAM * block_m))


def aot_configs(block_ds: tuple[int, ...] = (32, 64, 128)) -> list[KernelConfig]:
    """Configs the AOT build compiles: every dtype x BLOCK_D in `block_ds` x both T ranges."""
    return [c for dt in ("fp16", "bf16", "fp32") for bd in block_ds for c in _CONFIGS[(dt, bd)]]
