"""AOT jobs of the merge kernel (`raggedvit/kernels/_merge_kernel.py:_ragged_merge`, com.raggedvit::RaggedMerge).

One job per arch x x dtype x padded width (MERGE_WIDTHS: NP, num_warps) x head-dim block (MERGE_HEAD_DIMS), with
the kernel file's tile sizes, as the JIT launch uses them; compiled by `_aot.compile_job` like the other jobs. Bias,
size, the fused residual (skip, skip bias) and the class-token order are runtime flags (no variants). C and Dh are
hinted as multiples of 16 (aligned rows: vector loads), which the C++ launcher requires. The launcher takes the
smallest NP >= n_A and the smallest BLOCK_D >= Dh.

This module must not import torch or raggedvit: it runs inside the package build.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raggedvit.custom_ops._aot import ARCHS, KERNELS_DIR, _load_module

__all__ = ["MERGE_DTYPES", "MergeJob", "make_merge_plan", "merge_rule"]

MERGE_SOURCE = KERNELS_DIR / "_merge_kernel.py"
MERGE_DTYPES = ("fp16", "fp32")  # x / qkv / qkv_bias / x_out; the CUDA EP registers float16 and float
_ARGS = ("X", "QKV", "Bias", "Size", "Skip", "SkipBias", "XOut", "SizeOut", "CuOut", "Src", "KeyBias", "Score", "n",
         "C", "H", "Dh", "num_prefix", "r", "has_bias", "has_size", "has_skip", "has_skip_bias",
         "class_token")  # fmt: skip
_TYPED = ("X", "QKV", "Bias", "Skip", "SkipBias", "XOut")  # of the dtype (Size, SizeOut, KeyBias, Score fp32; CuOut,
# Src int64)
_ITEMSIZE = {"fp16": 2, "bf16": 2, "fp32": 4}


@dataclass(frozen=True)
class MergeJob:
    dtype: str  # "fp16" | "fp32"
    arch: int
    width: int  # NP: A rows per image up to it
    block_d: int  # BLOCK_D: head dims up to it
    num_warps: int
    block_a: int
    block_b: int
    block_m: int
    block_rows: int
    block_c: int
    num_stages: int = 1
    kernel: str = "ragged_merge"

    @property
    def function(self) -> str:
        return "_ragged_merge"

    @property
    def source(self) -> Path:
        return MERGE_SOURCE

    @property
    def hinted_ints(self) -> tuple[str, ...]:
        return ("C", "Dh")  # 16-divisible rows (the launcher checks C % 16 == 0 and Dh % 16 == 0)

    def signature(self) -> tuple[dict[str, str], dict[str, int]]:
        """Triton signature (arg -> type) and constexprs: X, QKV, Bias, Skip, SkipBias, XOut of dtype, Size, SizeOut,
        KeyBias, Score fp32, CuOut, Src int64, ints i32 (the flags too)."""
        sig = {n: "i32" for n in _ARGS}
        sig.update({n: "*" + self.dtype for n in _TYPED})
        sig.update({n: "*fp32" for n in ("Size", "SizeOut", "KeyBias", "Score")})
        sig.update({"CuOut": "*i64", "Src": "*i64"})
        consts = {"NP": self.width, "BLOCK_D": self.block_d, "BLOCK_A": self.block_a, "BLOCK_B": self.block_b,
                  "BLOCK_M": self.block_m, "BLOCK_ROWS": self.block_rows, "BLOCK_C": self.block_c}  # fmt: skip
        sig.update({k: "constexpr" for k in consts})
        return sig, consts


def _module() -> Any:
    return _load_module(MERGE_SOURCE, "_raggedvit_aot_merge_kernel")


def merge_rule() -> dict[str, Any]:
    """The compiled widths (NP: num_warps) and head-dim blocks, the tiles, for the build info."""
    m = _module()
    return {
        "widths": {str(np_): warps for np_, warps in m.MERGE_WIDTHS},
        "head_dims": [int(d) for d in m.MERGE_HEAD_DIMS],
        "tiles": {"block_a": int(m.MERGE_BLOCK_A), "block_b": int(m.MERGE_BLOCK_B), "block_m": int(m.MERGE_BLOCK_M),
                  "block_rows": int(m.MERGE_BLOCK_ROWS), "row_bytes": int(m.MERGE_ROW_BYTES)},
    }  # fmt: skip


def make_merge_plan(archs: tuple[int, ...] = ARCHS) -> list[MergeJob]:
    """Every arch x dtype x width x head-dim block of the merge kernel."""
    m = _module()
    return [
        MergeJob(
            dt,
            arch,
            int(np_),
            int(bd),
            int(warps),
            int(m.MERGE_BLOCK_A),
            int(m.MERGE_BLOCK_B),
            int(m.MERGE_BLOCK_M),
            int(m.MERGE_BLOCK_ROWS),
            int(m.MERGE_ROW_BYTES) // _ITEMSIZE[dt],
        )  # fmt: skip
        for arch in archs
        for dt in MERGE_DTYPES
        for np_, warps in m.MERGE_WIDTHS
        for bd in m.MERGE_HEAD_DIMS
    ]
