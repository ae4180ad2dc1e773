"""AOT jobs of the selection kernels (`raggedvit/kernels/_select_kernel.py`: `_select_count`, `_select_scatter`).

One job per kernel x arch x sort width (fp32 scores, int64 cu: no dtype variants): the kernel file's
SELECT_SORT_WIDTHS (WP, num_warps) and SELECT_BLOCK, as the JIT launch uses them; compiled by `_aot.compile_job` like
the other jobs. The C++ launcher runs the smallest WP >= the image width W, else the largest (W > WP: the kernels'
pairwise path).

This module must not import torch or raggedvit: it runs inside the package build.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from raggedvit.custom_ops._aot import ARCHS, KERNELS_DIR, _load_module

__all__ = ["SELECT_KERNELS", "SelectJob", "make_select_plan"]

SELECT_SOURCE = KERNELS_DIR / "_select_kernel.py"
_ARGS = {
    "count": ("Scores", "CU", "K", "T", "B", "W", "num_prefix", "policy", "keep_bits", "mass_bits"),
    "scatter": ("Scores", "CU", "K", "Src", "CuNew", "SeqId", "Pos", "T", "B", "W", "bound", "num_prefix"),
}
_POINTERS = ("CU", "K", "Src", "CuNew", "SeqId", "Pos")  # int64 buffers (Scores: fp32)
SELECT_KERNELS = tuple(_ARGS)  # launch order


@dataclass(frozen=True)
class SelectJob:
    kernel: str  # "count" | "scatter"
    arch: int
    sort_width: int  # WP
    num_warps: int
    block: int = 128  # BLOCK (pairwise tile)
    num_stages: int = 1

    @property
    def function(self) -> str:
        return f"_select_{self.kernel}"

    @property
    def source(self) -> Path:
        return SELECT_SOURCE

    @property
    def hinted_ints(self) -> tuple[str, ...]:
        return ()

    def signature(self) -> tuple[dict[str, str], dict[str, int]]:
        """Scores *fp32, every other pointer *i64, ints i32; BLOCK and WP constexpr."""
        sig = {n: "*fp32" if n == "Scores" else "*i64" if n in _POINTERS else "i32" for n in _ARGS[self.kernel]}
        sig["BLOCK"] = sig["WP"] = "constexpr"
        return sig, {"BLOCK": self.block, "WP": self.sort_width}


def make_select_plan(archs: tuple[int, ...] = ARCHS) -> list[SelectJob]:
    """Both kernels for every arch and sort width, with the kernel file's SELECT_SORT_WIDTHS and SELECT_BLOCK."""
    module = _load_module(SELECT_SOURCE, "_raggedvit_aot_select_kernel")
    block = int(module.SELECT_BLOCK)
    return [
        SelectJob(kernel, arch, int(wp), int(warps), block)
        for arch in archs
        for wp, warps in module.SELECT_SORT_WIDTHS
        for kernel in SELECT_KERNELS
    ]
