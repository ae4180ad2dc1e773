"""Launch configs of the ragged linear kernels (`_linear_kernel._ragged_linear`, `_ragged_linear_tma`): one table for
the torch op's JIT launch and the AOT build (which loads this file without torch or raggedvit, like `_config.py`).

On sm_90 every launch from LARGE_T rows takes the persistent TMA kernel with 64 x 128 x 64 tiles on 4 warps, 4
stages, two programs per SM and the epilogue in two 64-column slices ("tma": ~104 KiB of shared memory each, so two
fit an SM and one's epilogue overlaps the other's K loop), its epilogue's GELU being `gelu_poly` (`_linear_kernel.py`).
These tiles were measured as shipped (AOT cubins through ONNX Runtime, one op library per candidate, the block GEMMs of
deit_base and deit_small over capacity layouts): the fastest or close to it against larger and deeper tiles; the
table is in docs/decisions.md. The pointer kernel's configs below are every other arch's, and sm_90's under LARGE_T
rows.

Pointer kernel: below ~1k rows 64-row tiles win, with 32-column tiles for narrow outputs (proj, fc2: N <= 1024);
from thousands of rows 128 x 256 x 64 tiles on 8 warps with 4 stages are the best or close to it for every shape,
but they need ~192 KiB of shared memory: sm_90 only. Other archs keep 128 x 128 x 64 ("large"; the AOT build skips
"xlarge" there and the C++ launcher falls back to the next smaller config).

A capacity layout (a device-side live count, has_live) is different: after a cls-mass stage only part of its rows
are live, and large tiles leave too few live programs to fill the GPU (the 128 x 256 tiles at 883 live rows leave
21 programs for fc2's K = 3072). There, outputs up to CAPACITY_NARROW_N columns take the 64 x 64 tiles at every T;
wider outputs (deit_base's qkv, fc1) keep the large tiles. Figures for all three choices: docs/decisions.md.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "GELU_LARGE_M",
    "CAPACITY_NARROW_N",
    "LARGE_T",
    "TMA_MIN_ARCH",
    "XLARGE_MIN_ARCH",
    "GeluConfig",
    "LinearConfig",
    "aot_gelu_configs",
    "aot_linear_configs",
    "first_unwritten_row",
    "gelu_config",
    "linear_config",
]

LARGE_T = 1024  # rows (the capacity, T) from which the large-tile config is used
NARROW_N = 1024  # output width up to which small-T launches use 32-column tiles
CAPACITY_NARROW_N = 1536  # output width up to which capacity launches (has_live) from LARGE_T rows use 64 x 64
GROUP_M = 8
XLARGE_MIN_ARCH = 90  # the "xlarge" tiles need Hopper's shared memory (227 KiB per block)
TMA_MIN_ARCH = 90  # the tensor memory accelerator (Hopper)


@dataclass(frozen=True)
class LinearConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    group_m: int = GROUP_M
    tma: bool = False  # the persistent TMA kernel `_ragged_linear_tma` (sm_90 and newer, fp16 / bf16)
    programs_per_sm: int = 1  # TMA: the persistent grid is min(programs_per_sm x SMs, tiles)
    epilogue_split: int = 1  # TMA: the epilogue stores BLOCK_N / epilogue_split columns at a time (1 or 2)

    def __post_init__(self) -> None:
        # `_ragged_linear_tma` has exactly these two epilogues; the launchers size the Res / Y blocks by the split
        if self.epilogue_split not in (1, 2) or self.block_n % self.epilogue_split:
            raise ValueError(f"epilogue_split must be 1 or 2 and divide block_n = {self.block_n}, "
                             f"got {self.epilogue_split}")  # fmt: skip


_SMALL_NARROW = LinearConfig(64, 32, 64, 4, 4)
_SMALL_WIDE = LinearConfig(64, 64, 64, 4, 4)
_LARGE = LinearConfig(128, 128, 64, 8, 3)
_XLARGE = LinearConfig(128, 256, 64, 8, 4)
_TMA = LinearConfig(64, 128, 64, 4, 4, tma=True, programs_per_sm=2, epilogue_split=2)


def linear_config(T: int, N: int, arch: int | None = None, has_live: bool = False, tma: bool = True) -> LinearConfig:
    """The config for a launch over T rows (the capacity) and N output columns (fp16 / bf16 / fp32 alike) on an
    sm_`arch` GPU (None: an arch not known, e.g. the interpreter: the configs every arch can run); has_live: the
    launch reads a device-side live count (CuSeqlens), so its dead rows are skipped; tma=False: the pointer
    kernel's configs only (the rule before the TMA kernel, for comparisons)."""
    if tma and T >= LARGE_T and arch is not None and arch >= TMA_MIN_ARCH:
        return _TMA
    if T >= LARGE_T and has_live and N <= CAPACITY_NARROW_N:
        return _SMALL_WIDE
    if T >= LARGE_T:
        return _XLARGE if arch is not None and arch >= XLARGE_MIN_ARCH else _LARGE
    return _SMALL_NARROW if N <= NARROW_N else _SMALL_WIDE


def first_unwritten_row(config: LinearConfig, live: int) -> int:
    """The first output row a launch under `config` never writes when `live` rows are live: the pointer kernel
    writes the live rows only, the TMA kernel whole BLOCK_M-row tiles up to the last live one."""
    return -(-live // config.block_m) * config.block_m if config.tma else live


def aot_linear_configs() -> list[tuple[str, LinearConfig]]:
    """(name, config) of every config `linear_config` can return, in ascending order of preference (a launcher
    without an arch's cubin of one falls back to the one before it); the AOT build compiles each ("xlarge" and
    "tma" for sm_90 and newer only), and the C++ launcher applies the same rule (LARGE_T, NARROW_N,
    CAPACITY_NARROW_N, TMA_MIN_ARCH) to pick one."""
    return [("small_narrow", _SMALL_NARROW), ("small_wide", _SMALL_WIDE), ("large", _LARGE), ("xlarge", _XLARGE),
            ("tma", _TMA)]  # fmt: skip


# ---- the bias + GELU kernel (`_linear_kernel._bias_gelu`), same file for the same reason ----
# One row per program with 1,024 columns is the fastest at a few hundred rows, and 8 x 512 tiles on 4 warps at
# thousands of rows (deit's fc1 outputs; figures in docs/decisions.md).
GELU_LARGE_M = 1024  # rows (M = elements / N) from which the large-tile config is used


@dataclass(frozen=True)
class GeluConfig:
    block_m: int
    block_n: int
    num_warps: int


_GELU_SMALL = GeluConfig(1, 1024, 4)
_GELU_LARGE = GeluConfig(8, 512, 4)


def gelu_config(M: int) -> GeluConfig:
    """The config of a bias + GELU launch over M rows (every dtype and arch)."""
    return _GELU_LARGE if M >= GELU_LARGE_M else _GELU_SMALL


def aot_gelu_configs() -> list[tuple[str, GeluConfig]]:
    """(name, config) of every config `gelu_config` can return; the C++ launcher applies the same rule."""
    return [("small", _GELU_SMALL), ("large", _GELU_LARGE)]
