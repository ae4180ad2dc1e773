"""AOT jobs of the patch embedding kernel (`raggedvit/kernels/_embed_kernel.py:_patch_embed`): one job per image
dtype x config x alignment x arch, compiled by `_aot.compile_job` like the other kernels. A cubin whose shared
memory exceeds its arch's opt-in limit is not emitted (`_aot_linear.fits_arch`); the launcher then takes the next
smaller config.

Alignment: the "aligned" cubins are compiled with Wd, patch and K known to be multiples of 16 (the launcher takes
them when patch % 16 == 0 and W % 16 == 0: ViT-B/16 at 224), so a patch row's pixels load as 16-byte vectors; the
others assume nothing (patch 14, odd widths). Without the hints the AOT kernel is much slower than the JIT one,
which Triton specialises on those divisibilities by itself (docs/decisions.md).

This module must not import torch or raggedvit: it runs inside the package build.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raggedvit.custom_ops._aot import ARCHS, KERNELS_DIR, _load_module

__all__ = ["EMBED_IMAGE_DTYPES", "EmbedJob", "embed_rule", "make_embed_plan"]

EMBED_SOURCE = KERNELS_DIR / "_embed_kernel.py"
EMBED_IMAGE_DTYPES = ("fp32", "fp16")  # Images; Weight is float16, Prefix / Pos float32, Out float16
_ARGS = ("Img", "W", "Prefix", "Pos", "Out", "B", "C", "H", "Wd", "gw", "L", "P", "N", "K", "patch")


@dataclass(frozen=True)
class EmbedJob:
    dtype: str  # the image dtype: "fp32" | "fp16"
    arch: int
    config: str  # name in aot_embed_configs(): "small" | "mid" | "large"
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    aligned: bool = False  # Wd, patch, K multiples of 16 (hinted)
    kernel: str = "patch_embed"

    @property
    def function(self) -> str:
        return "_patch_embed"

    @property
    def source(self) -> Path:
        return EMBED_SOURCE

    @property
    def hinted_ints(self) -> tuple[str, ...]:
        # 16-divisible rows: vector loads and stores (the launcher checks N % 16 == 0, and the alignment's rule)
        return ("N", "Wd", "patch", "K") if self.aligned else ("N",)

    def signature(self) -> tuple[dict[str, str], dict[str, int]]:
        """Triton signature (arg -> type) and constexprs: Img of dtype, W / Out fp16, Prefix / Pos fp32, ints i32."""
        sig = {n: "i32" for n in _ARGS}
        sig.update({"Img": "*" + self.dtype, "W": "*fp16", "Out": "*fp16", "Prefix": "*fp32", "Pos": "*fp32"})
        consts = {"BLOCK_M": self.block_m, "BLOCK_N": self.block_n, "BLOCK_K": self.block_k}
        sig.update({k: "constexpr" for k in consts})
        return sig, consts


def _module() -> Any:
    return _load_module(EMBED_SOURCE, "_raggedvit_aot_embed_kernel")


def embed_rule() -> dict[str, int]:
    """The selection thresholds of `embed_config` (rows B * L), for the C++ launcher's copy of the rule."""
    m = _module()
    return {"mid_m": int(m.EMBED_MID_M), "large_m": int(m.EMBED_LARGE_M)}


def make_embed_plan(archs: tuple[int, ...] = ARCHS) -> list[EmbedJob]:
    """Every image dtype x config x alignment x arch of the patch embedding kernel."""
    return [
        EmbedJob(dt, arch, name, c.block_m, c.block_n, c.block_k, c.num_warps, c.num_stages, aligned)
        for arch in archs
        for dt in EMBED_IMAGE_DTYPES
        for name, c in _module().aot_embed_configs()
        for aligned in (False, True)
    ]
