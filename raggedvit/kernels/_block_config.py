"""Launch configs of the block engine's kernel (`_block_kernel._vit_block`), shared by the JIT launcher
(`block_engine.py`) and the AOT build (`custom_ops/_aot_block.py`, which imports neither torch nor raggedvit, so
this module imports nothing of either).

A config is the kernel's tile constexprs plus its launch options, one per GEMM dtype name ("fp16", "bf16",
"fp32"); `kernel_constexprs` turns (config, block shape, optional inputs) into the kernel's constexpr arguments,
the one place that spells them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "AOT_BLOCK_CS",
    "ENGINE_CONFIGS",
    "SPIN_LIMIT",
    "EngineConfig",
    "block_c",
    "kernel_constexprs",
    "max_tiles",
    "occupancy",
    "workspace_counters",
]

SPIN_LIMIT = 1 << 22  # polls of one barrier before a program gives up (a wrong result instead of a hang)
# BLOCK_C of the AOT cubins (the launcher takes the smallest >= C; the LayerNorm phases mask the columns past C,
# which only the two norm phases read); the JIT takes block_c(C) itself
AOT_BLOCK_CS = (1024,)


@dataclass(frozen=True)
class EngineConfig:
    """Tiles (constexprs) and launch options of `_vit_block` for one GEMM dtype."""

    bm: int  # rows of a GEMM tile
    bn_wide: int  # columns of a qkv / fc1 tile
    bn_narrow: int  # columns of a proj / fc2 tile
    bk: int  # K step of the GEMMs
    att_bm: int  # query rows of an attention tile
    att_bn: int  # key rows per step of the attention loop
    cls_bn: int  # tokens of a cls_attn tile
    cls_hg: int  # heads per cls_attn step
    num_warps: int
    num_stages: int
    split_proj: int = 1  # K slices of a proj tile (split-K)
    split_fc2: int = 1  # K slices of an fc2 tile
    norm_rows: int = 4  # rows per LayerNorm task
    programs_per_sm: int = 1  # wanted; the launcher takes fewer where registers or shared memory do not allow it
    m_fast: bool = True  # GEMM tasks ordered row tile fastest (else weight column block fastest)
    prefetch: bool = False  # all four weights asked into L2 at the start of the launch


_TENSOR_CORE = EngineConfig(64, 64, 64, 64, 64, 64, 16, 4, num_warps=4, num_stages=4, split_proj=2, split_fc2=4,
                            programs_per_sm=2)  # fmt: skip
# tensor-core tiles for fp16 / bf16, small ieee tiles for fp32
ENGINE_CONFIGS = {
    "fp16": _TENSOR_CORE,
    "bf16": _TENSOR_CORE,
    "fp32": EngineConfig(32, 32, 32, 32, 32, 32, 16, 4, num_warps=4, num_stages=1, split_proj=2, split_fc2=2),
}


def block_c(C: int) -> int:
    """BLOCK_C of the LayerNorm phases: the next power of two >= C."""
    if C < 1:
        raise ValueError(f"C must be >= 1, got {C}")
    return 1 << (C - 1).bit_length()


def max_tiles(T: int, C: int, cfg: EngineConfig) -> int:
    """Output tiles of proj / fc2 ([T, C] in bm x bn_narrow tiles), at least 1."""
    return max(1, -(-T // cfg.bm) * -(-C // cfg.bn_narrow))


def workspace_counters(T: int, C: int, cfg: EngineConfig) -> int:
    """int32 counters of a launch's workspace: 2 * max_tiles split-K tile counters (proj's, fc2's), then the grid
    barrier's counter and the exit counter (`_block_kernel` module docstring). Zeros between launches."""
    return 2 * max_tiles(T, C, cfg) + 2


def kernel_constexprs(
    cfg: EngineConfig, BLOCK_C: int, BLOCK_D: int, elem_bytes: int, *, qkv_bias: bool, proj_bias: bool,
    fc1_bias: bool, fc2_bias: bool, ls1: bool, ls2: bool, cls_attn: bool,
) -> dict[str, int | bool]:  # fmt: skip
    """The constexpr arguments of `_vit_block` (without num_warps / num_stages): which optional inputs are present,
    whether cls_attn is written, the config's tiles, BLOCK_C >= C, BLOCK_D >= D, and the prefetch line (128 bytes
    of weight elements of elem_bytes)."""
    return dict(
        HAS_QKV_B=qkv_bias, HAS_PROJ_B=proj_bias, HAS_FC1_B=fc1_bias, HAS_FC2_B=fc2_bias, HAS_LS1=ls1, HAS_LS2=ls2,
        CLS_ATTN=cls_attn, BM=cfg.bm, BN_WIDE=cfg.bn_wide, BN_NARROW=cfg.bn_narrow, BK=cfg.bk,
        SPLIT_PROJ=cfg.split_proj, SPLIT_FC2=cfg.split_fc2, NORM_ROWS=cfg.norm_rows, BLOCK_C=BLOCK_C,
        ATT_BM=cfg.att_bm, ATT_BN=cfg.att_bn, BLOCK_D=BLOCK_D, CLS_BN=cfg.cls_bn, CLS_HG=cfg.cls_hg,
        M_FAST=cfg.m_fast, PREFETCH=cfg.prefetch, PF_LINE=128 // elem_bytes, SPIN_LIMIT=SPIN_LIMIT,
    )  # fmt: skip


def occupancy(n_regs: int, shared_bytes: int, num_warps: int) -> int:
    """Programs one sm_80 / sm_90 multiprocessor holds at once: 64K registers allocated per warp in 256-register
    units, 227 KiB of shared memory (+ 1 KiB reserved per program), at most 32 programs."""
    regs_per_warp = -(-max(n_regs, 1) * 32 // 256) * 256
    by_regs = (65536 // regs_per_warp) // num_warps
    by_smem = (233472 // (shared_bytes + 1024)) if shared_bytes else 32
    return max(0, min(by_regs, by_smem, 32))
