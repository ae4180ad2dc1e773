"""AOT jobs of the gather + LayerNorm kernel (`raggedvit/kernels/_norm_kernel.py:_gather_layer_norm`): one job per
dtype x CuSeqlens dtype x config (BLOCK_D) x arch, compiled by `_aot.compile_job` like the other kernels (the
launcher takes the cu dtype's cubin; without CuSeqlens any of them, has_live = 0).

This module must not import torch or raggedvit: it runs inside the package build.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raggedvit.custom_ops._aot import ARCHS, CU_DTYPES, KERNELS_DIR, _load_module

__all__ = ["NORM_DTYPES", "NormJob", "make_norm_plan", "norm_rule"]

NORM_SOURCE = KERNELS_DIR / "_norm_kernel.py"
NORM_DTYPES = ("fp16", "bf16")  # like BiasGelu: the exporter writes the op for float16 rows only
_ARGS = ("X", "Skip", "Bias", "Index", "Gamma", "Beta", "CU", "N", "Sum", "T", "R", "D", "B", "eps", "has_skip",
         "has_bias", "has_live")  # fmt: skip


@dataclass(frozen=True)
class NormJob:
    dtype: str  # "fp16" | "bf16"
    cu_dtype: str  # "i32" | "i64"
    arch: int
    block_r: int
    block_d: int
    num_warps: int
    num_stages: int = 1
    kernel: str = "gather_layer_norm"

    @property
    def function(self) -> str:
        return "_gather_layer_norm"

    @property
    def source(self) -> Path:
        return NORM_SOURCE

    @property
    def hinted_ints(self) -> tuple[str, ...]:
        return ("D",)  # 16-divisible rows: vector loads (the launcher checks D % 16 == 0)

    def signature(self) -> tuple[dict[str, str], dict[str, int]]:
        """Triton signature (arg -> type) and constexprs: data pointers of dtype, Index int64, CU of cu_dtype, eps
        fp32, ints i32."""
        sig = {n: "i32" for n in _ARGS}
        sig.update({n: "*" + self.dtype for n in ("X", "Skip", "Bias", "Gamma", "Beta", "N", "Sum")})
        sig.update({"Index": "*i64", "CU": "*" + self.cu_dtype, "eps": "fp32"})
        consts = {"BLOCK_R": self.block_r, "BLOCK_D": self.block_d}
        sig.update({k: "constexpr" for k in consts})
        return sig, consts


def _module() -> Any:
    return _load_module(NORM_SOURCE, "_raggedvit_aot_norm_kernel")


def norm_rule() -> dict[str, Any]:
    """The BLOCK_D of the compiled variants (the launcher takes the smallest >= D), for the build info."""
    return {"block_ds": [int(d) for d in _module().NORM_BLOCK_DS]}


def make_norm_plan(archs: tuple[int, ...] = ARCHS) -> list[NormJob]:
    """Every dtype x cu dtype x config x arch of the gather + LayerNorm kernel."""
    return [
        NormJob(dt, cu, arch, c.block_r, c.block_d, c.num_warps)
        for arch in archs
        for dt in NORM_DTYPES
        for cu in CU_DTYPES
        for c in _module().aot_norm_configs()
    ]
