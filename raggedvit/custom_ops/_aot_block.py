"""AOT jobs of the block engine's kernel (`raggedvit/kernels/_block_kernel.py:_vit_block`, one whole pre-norm ViT
block per persistent launch), compiled by `_aot.compile_job` like the other kernels.

One job per (stream dtype, arch, cls_attn, LayerScale, BLOCK_C) for the layouts the exporter writes: GEMMs in
float16 with the residual stream in float32 (the fp16 recipe) or float16 (fp16-all), cu_seqlens int64, all four
Linear biases present (timm's VisionTransformer blocks), both LayerScales present or both absent. The tiles are
the fp16 engine config of `raggedvit/kernels/_block_config.py` (the JIT launcher's); BLOCK_C is the smallest of
AOT_BLOCK_CS >= C. `block_report` reads each cubin's registers, spills and shared memory (cuobjdump from the
triton wheel) for the build info.

This module must not import torch or raggedvit: it runs inside the package build.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raggedvit.custom_ops._aot import KERNELS_DIR, _load_module

__all__ = [
    "BLOCK_ARCHS",
    "BLOCK_STREAM_DTYPES",
    "BlockJob",
    "block_report",
    "block_rule",
    "config_module",
    "make_block_plan",
]

BLOCK_SOURCE = KERNELS_DIR / "_block_kernel.py"
CONFIG_SOURCE = KERNELS_DIR / "_block_config.py"
# the kernel's own imports: loaded by path under their package names, so the build never imports raggedvit (whose
# package __init__ imports torch); their sources are part of the cache key
_DEPENDENCIES = (("raggedvit.kernels._kernel", KERNELS_DIR / "_kernel.py"),
                 ("raggedvit.kernels._linear_kernel", KERNELS_DIR / "_linear_kernel.py"))  # fmt: skip
BLOCK_ARCHS = (80, 90)  # the grid barrier needs every program resident: sm_80 and newer hold the fp16 config twice
BLOCK_STREAM_DTYPES = ("fp32", "fp16")
GEMM_DTYPE = "fp16"
HEAD_DIM = 64  # BLOCK_D of the cubins: head dims 33..64 (every timm ViT-Ti/S/B/L)

_PTRS = ("X", "CU", "Ln1W", "Ln1B", "Wqkv", "Bqkv", "Wproj", "Bproj", "Ls1", "Ln2W", "Ln2B", "Wfc1", "Bfc1", "Wfc2",
         "Bfc2", "Ls2", "Xn", "Qkv", "Att", "Lse", "Cls", "X1", "Hid", "Part", "Ctr", "Y")  # fmt: skip
_INTS = ("T", "B", "J", "C", "F", "H", "D", "eps", "qk_scale", "ph_lo", "ph_hi", "max_tiles")
_STREAM_PTRS = ("X", "Ln1W", "Ln1B", "Ls1", "Ln2W", "Ln2B", "Ls2", "X1", "Y")


@dataclass(frozen=True)
class BlockJob:
    stream_dtype: str  # "fp32" | "fp16": x, the norms, the LayerScales, x1 and y
    arch: int
    cls_attn: bool
    layer_scale: bool
    block_c: int
    gemm_dtype: str = GEMM_DTYPE
    cu_dtype: str = "i64"
    kernel: str = "vit_block"

    @property
    def function(self) -> str:
        return "_vit_block"

    @property
    def source(self) -> Path:
        return BLOCK_SOURCE

    @property
    def extra_sources(self) -> tuple[Path, ...]:
        return (CONFIG_SOURCE, *(path for _, path in _DEPENDENCIES))

    @property
    def hinted_ints(self) -> tuple[str, ...]:
        return ("C", "F", "D")  # the launcher checks C, F and D are multiples of 16 (the JIT's specialization)

    @property
    def config(self) -> Any:
        return config_module().ENGINE_CONFIGS[self.gemm_dtype]

    @property
    def num_warps(self) -> int:
        return int(self.config.num_warps)

    @property
    def num_stages(self) -> int:
        return int(self.config.num_stages)

    def prepare(self) -> None:
        """Registers the kernel's imports (by path) before its source is loaded."""
        for name, path in _DEPENDENCIES:
            if name not in sys.modules:
                _load_module(path, name)

    def signature(self) -> tuple[dict[str, str], dict[str, Any]]:
        """Triton signature (arg -> type) and constexprs: stream pointers of stream_dtype, GEMM weights and
        scratch of gemm_dtype, Lse / Cls / Part fp32, Ctr int32, CU of cu_dtype; eps and qk_scale fp32."""
        ptr = {n: self.gemm_dtype for n in _PTRS}
        ptr.update({n: self.stream_dtype for n in _STREAM_PTRS})
        ptr.update({"CU": self.cu_dtype, "Lse": "fp32", "Cls": "fp32", "Part": "fp32", "Ctr": "i32"})
        sig = {n: "*" + ptr[n] for n in _PTRS}
        sig.update({n: "fp32" if n in ("eps", "qk_scale") else "i32" for n in _INTS})
        consts = config_module().kernel_constexprs(
            self.config, self.block_c, HEAD_DIM, 2, qkv_bias=True, proj_bias=True, fc1_bias=True, fc2_bias=True,
            ls1=self.layer_scale, ls2=self.layer_scale, cls_attn=self.cls_attn,
        )  # fmt: skip
        sig.update({k: "constexpr" for k in consts})
        return sig, consts


@functools.cache
def config_module() -> Any:
    """`kernels/_block_config.py`, loaded by path once per process (the jobs, the plan and the build info read it)."""
    return _load_module(CONFIG_SOURCE, "_raggedvit_aot_block_config")


def block_rule() -> dict[str, Any]:
    """What the launcher may run, for the build info: the config and the cubins' variant axes."""
    module = config_module()
    cfg = module.ENGINE_CONFIGS[GEMM_DTYPE]
    return {"gemm_dtype": GEMM_DTYPE, "head_dim_max": HEAD_DIM, "block_cs": list(module.AOT_BLOCK_CS),
            "stream_dtypes": list(BLOCK_STREAM_DTYPES), "cu_dtype": "i64", "config": dict(vars(cfg))}  # fmt: skip


def make_block_plan(archs: tuple[int, ...]) -> list[BlockJob]:
    """Every stream dtype x cls_attn x LayerScale x BLOCK_C of BLOCK_ARCHS among `archs`."""
    return [
        BlockJob(stream, arch, cls_attn, ls, bc)
        for arch in archs
        if arch in BLOCK_ARCHS
        for stream in BLOCK_STREAM_DTYPES
        for cls_attn in (False, True)
        for ls in (False, True)
        for bc in config_module().AOT_BLOCK_CS
    ]


def _cuobjdump() -> Path:
    import triton

    return Path(triton.__file__).resolve().parent / "backends" / "nvidia" / "bin" / "cuobjdump"


def block_report(cubin: bytes, function_name: str) -> dict[str, int]:
    """registers, stack / local (spill) bytes and static shared bytes of `function_name` in `cubin`, from
    `cuobjdump --dump-resource-usage` (triton's copy)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        out = subprocess.run([str(_cuobjdump()), "--dump-resource-usage", str(path)], capture_output=True,
                             text=True, check=True).stdout  # fmt: skip
    at = out.find(function_name)
    line = out[at:].splitlines()[1] if at >= 0 and len(out[at:].splitlines()) > 1 else ""
    fields = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", line))
    if "REG" not in fields:
        raise RuntimeError(f"cuobjdump printed no resource usage for {function_name}: {out[-400:]!r}")
    return {
        "registers": int(fields["REG"]),
        "stack_bytes": int(fields.get("STACK", 0)),
        "local_bytes": int(fields.get("LOCAL", 0)),
        "static_shared_bytes": int(fields.get("SHARED", 0)),
    }
