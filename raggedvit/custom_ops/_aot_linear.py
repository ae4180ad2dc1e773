"""AOT jobs of the ragged linear kernel (`raggedvit/kernels/_linear_kernel.py:_ragged_linear`) and of the bias +
GELU kernel of the same file (`_bias_gelu`: one job per dtype x config x arch, `make_gelu_plan`).

One job per dtype (fp16, bf16) x cu dtype x launch config of `raggedvit/kernels/_linear_config.py` x arch; compiled
by `_aot.compile_job` like the attention jobs. A config whose shared memory exceeds the arch's opt-in limit is not
emitted (`fits_arch`); the launcher then falls back to the next smaller config of that arch.

This module must not import torch or raggedvit: it runs inside the package build.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raggedvit.custom_ops._aot import ARCHS, CU_DTYPES, KERNELS_DIR, _load_module

__all__ = [
    "LINEAR_DTYPES",
    "SHARED_OPTIN_BYTES",
    "GeluJob",
    "LinearJob",
    "fits_arch",
    "gelu_rule",
    "linear_rule",
    "make_gelu_plan",
    "make_linear_plan",
]

LINEAR_SOURCE = KERNELS_DIR / "_linear_kernel.py"
LINEAR_CONFIG_SOURCE = KERNELS_DIR / "_linear_config.py"
LINEAR_DTYPES = ("fp16", "bf16")  # no fp32 CUDA kernel: ORT places fp32 nodes on the CPU EP
# Largest dynamic shared memory per block a kernel may opt in to (CUDA programming guide, compute capabilities).
SHARED_OPTIN_BYTES = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024}

_ARGS = ("X", "W", "Bias", "Res", "CU", "Y", "T", "N", "K", "B", "has_bias", "has_res", "has_live", "activation")
# `_ragged_linear_tma`: X, W, Res, Y as TMA descriptors (each a CUtensorMap, then its 2 int32 sizes and 2 int64
# strides in the cubin's params), the persistent grid's size last
_TMA_ARGS = ("X_desc", "W_desc", "Res_desc", "Y_desc", "Bias", "CU", *_ARGS[6:], "num_programs")
# the launcher encodes 128-byte swizzled boxes: 64 columns of 2-byte elements (BLOCK_K = 64; a BLOCK_N-wide block of
# Res / Y is copied as BLOCK_N / 64 boxes)
TMA_INNER_BYTES = 128


@dataclass(frozen=True)
class LinearJob:
    dtype: str  # "fp16" | "bf16"
    cu_dtype: str  # "i32" | "i64"
    arch: int
    config: str  # name in aot_linear_configs(): "small_narrow" | "small_wide" | "large" | "xlarge" | "tma"
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    kernel: str = "linear"
    tma: bool = False  # `_ragged_linear_tma` (config "tma")
    programs_per_sm: int = 1  # TMA: the launcher's persistent grid is min(programs_per_sm x SMs, tiles)
    epilogue_split: int = 1  # TMA: the epilogue's Res / Y blocks are BLOCK_N / epilogue_split columns wide

    @property
    def function(self) -> str:
        return "_ragged_linear_tma" if self.tma else "_ragged_linear"

    @property
    def source(self) -> Path:
        return LINEAR_SOURCE

    @property
    def hinted_ints(self) -> tuple[str, ...]:
        return ("N", "K")

    def signature(self) -> tuple[dict[str, str], dict[str, int]]:
        """Triton signature (arg -> type) and constexprs: data pointers of dtype, CU of cu_dtype, ints i32."""
        ptr = {"X": self.dtype, "W": self.dtype, "Bias": self.dtype, "Res": self.dtype, "Y": self.dtype,
               "CU": self.cu_dtype}  # fmt: skip
        sig = {n: ("*" + ptr[n]) if n in ptr else "i32" for n in (_TMA_ARGS if self.tma else _ARGS)}
        if self.tma:
            sig["X_desc"] = f"tensordesc<{self.dtype}[{self.block_m}, {self.block_k}]>"
            sig["W_desc"] = f"tensordesc<{self.dtype}[{self.block_n}, {self.block_k}]>"
            for name in ("Res_desc", "Y_desc"):
                sig[name] = f"tensordesc<{self.dtype}[{self.block_m}, {self.block_n // self.epilogue_split}]>"
        consts = {"BLOCK_M": self.block_m, "BLOCK_N": self.block_n, "BLOCK_K": self.block_k, "GROUP_M": self.group_m}
        if self.tma:
            consts["EPI_SPLIT"] = self.epilogue_split
        sig.update({k: "constexpr" for k in consts})
        return sig, consts


def _config_module() -> Any:
    return _load_module(LINEAR_CONFIG_SOURCE, "_raggedvit_aot_linear_config")


def linear_rule() -> dict[str, int]:
    """The selection thresholds of `linear_config` (LARGE_T, NARROW_N, CAPACITY_NARROW_N, TMA_MIN_ARCH), for the
    C++ launcher's copy of the rule."""
    module = _config_module()
    return {"large_t": int(module.LARGE_T), "narrow_n": int(module.NARROW_N),
            "capacity_narrow_n": int(module.CAPACITY_NARROW_N), "tma_min_arch": int(module.TMA_MIN_ARCH)}  # fmt: skip


def make_linear_plan(archs: tuple[int, ...] = ARCHS) -> list[LinearJob]:
    """Every dtype x cu dtype x config x arch (before the shared-memory filter; "xlarge" and "tma" for sm_90 and
    newer)."""
    module = _config_module()
    jobs = [
        LinearJob(
            dt,
            cu,
            arch,
            name,
            c.block_m,
            c.block_n,
            c.block_k,
            c.group_m,
            c.num_warps,
            c.num_stages,
            tma=c.tma,
            programs_per_sm=c.programs_per_sm,
            epilogue_split=c.epilogue_split,
        )
        for arch in archs
        for dt in LINEAR_DTYPES
        for cu in CU_DTYPES
        for name, c in module.aot_linear_configs()
        if (name != "xlarge" or arch >= module.XLARGE_MIN_ARCH)  # its shared memory exceeds the older archs'
        and (not c.tma or arch >= module.TMA_MIN_ARCH)  # TMA: Hopper and newer
    ]
    for j in jobs:
        slice_n = j.block_n // j.epilogue_split
        if j.tma and (j.block_k * 2 != TMA_INNER_BYTES or slice_n * 2 % TMA_INNER_BYTES):  # fp16 / bf16: 2 bytes
            raise ValueError(
                f"{j}: the launcher's TMA boxes are {TMA_INNER_BYTES} bytes wide (BLOCK_K 64, BLOCK_N / epilogue_split "
                "% 64)"
            )
    return jobs


def fits_arch(job: Any, shared_bytes: int) -> bool:
    """Whether a cubin of `job` (any job with an arch) needing shared_bytes can run on its arch (unknown archs: the
    sm_80 limit)."""
    return shared_bytes <= SHARED_OPTIN_BYTES.get(job.arch, SHARED_OPTIN_BYTES[80])


_GELU_ARGS = ("X", "Bias", "Y", "M", "N", "has_bias")


@dataclass(frozen=True)
class GeluJob:
    dtype: str  # "fp16" | "bf16"
    arch: int
    config: str  # name in aot_gelu_configs(): "small" | "large"
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int = 1
    kernel: str = "bias_gelu"

    @property
    def function(self) -> str:
        return "_bias_gelu"

    @property
    def source(self) -> Path:
        return LINEAR_SOURCE

    @property
    def hinted_ints(self) -> tuple[str, ...]:
        return ("N",)  # 16-divisible rows: vector loads (the launcher checks N % 16 == 0)

    def signature(self) -> tuple[dict[str, str], dict[str, int]]:
        """Triton signature (arg -> type) and constexprs: X, Bias, Y pointers of dtype, ints i32."""
        sig = {n: ("*" + self.dtype) if n in ("X", "Bias", "Y") else "i32" for n in _GELU_ARGS}
        consts = {"BLOCK_M": self.block_m, "BLOCK_N": self.block_n}
        sig.update({k: "constexpr" for k in consts})
        return sig, consts


def gelu_rule() -> dict[str, int]:
    """The selection threshold of `gelu_config` (GELU_LARGE_M), for the C++ launcher's copy of the rule."""
    return {"large_m": int(_config_module().GELU_LARGE_M)}


def make_gelu_plan(archs: tuple[int, ...] = ARCHS) -> list[GeluJob]:
    """Every dtype x config x arch of the bias + GELU kernel."""
    module = _config_module()
    return [
        GeluJob(dt, arch, name, c.block_m, c.block_n, c.num_warps)
        for arch in archs
        for dt in LINEAR_DTYPES
        for name, c in module.aot_gelu_configs()
    ]
