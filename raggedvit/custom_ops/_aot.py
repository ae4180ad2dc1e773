"""Ahead-of-time compilation of the Triton kernels to cubin (no GPU needed).

Compiles `raggedvit/kernels/_kernel.py` (the same source the torch op JIT-compiles) for a given
(kernel, dtype, cu dtype, BLOCK_D, arch) with the launch configs of `raggedvit/kernels/_config.py`.
Triton needs an active driver to compile for a target; on a machine without a GPU we install a stub
driver that only reports the requested target. Results are cached on disk, keyed by a hash of
(kernel source, triton version, job), so rebuilding is fast.

The ragged linear kernel's jobs are in `_aot_linear.py`; `compile_job` compiles either kind (a job names its
source, function, signature and hinted ints). This module must not import torch or raggedvit: it runs inside the
package build.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["AotJob", "AotResult", "compile_job", "kernel_configs", "make_plan"]

KERNELS_DIR = Path(__file__).resolve().parents[1] / "kernels"
KERNEL_SOURCE = KERNELS_DIR / "_kernel.py"
CONFIG_SOURCE = KERNELS_DIR / "_config.py"

DTYPES = ("fp16", "bf16", "fp32")
CU_DTYPES = ("i32", "i64")
BLOCK_DS = (32, 64, 128)
ARCHS = (80, 86, 89, 90)

# Used only when raggedvit/kernels/_config.py cannot be loaded (one dict to change).
FALLBACK_CONFIG: dict[str, int] = {
    "block_m": 64,
    "block_n": 64,
    "num_warps": 4,
    "num_stages": 2,
    "cls_block_n": 64,
    "cls_num_warps": 4,
    "cls_heads": 4,
}

# Kernel parameters in order; "ptr" args get the 16-byte divisibility hint, like D (the launcher checks both).
_FWD_ARGS = ("QKV", "Bias", "CU", "Out", "Lse", "PosTable", "TokPos", "KeyBias", "T", "B", "J", "H", "D",
             "scale_bits", "store_lse", "has_bias", "grid_h", "grid_w", "num_prefix")  # fmt: skip
_CLS_ARGS = ("QKV", "Bias", "CU", "Lse", "ClsAttn", "PosTable", "TokPos", "KeyBias", "T", "B", "H", "D", "scale_bits",
             "has_bias", "grid_h", "grid_w", "num_prefix")  # fmt: skip
# (HAS_POS, HAS_KEY_BIAS) of every kernel: neither, the relative position bias, the key bias (tome's proportional
# attention; the families with a relative position bias refuse tome, so the two never meet)
BIAS_VARIANTS = ((False, False), (True, False), (False, True))
_HINTED_INTS = ("D",)


@dataclass(frozen=True)
class AotJob:
    kernel: str  # "fwd" | "cls"
    dtype: str  # "fp16" | "bf16" | "fp32"
    cu_dtype: str  # "i32" | "i64"
    block_d: int
    arch: int
    block_m: int  # 0 for "cls"
    block_n: int
    num_warps: int
    num_stages: int
    has_pos: bool = False  # HAS_POS: relative position bias (PosTable, TokPos)
    cls_heads: int = 0  # "cls": HG, the heads per tile (`_config.KernelConfig.cls_heads`); 0 for "fwd"
    has_key_bias: bool = False  # HAS_KEY_BIAS: the per-key bias (KeyBias)

    @property
    def function(self) -> str:
        return "_ragged_attn_fwd" if self.kernel == "fwd" else "_ragged_cls_attn"

    @property
    def source(self) -> Path:
        return KERNEL_SOURCE

    @property
    def hinted_ints(self) -> tuple[str, ...]:
        return _HINTED_INTS

    def signature(self) -> tuple[dict[str, str], dict[str, int]]:
        """Triton signature (arg -> type) and constexprs of this job."""
        ptr = {"QKV": self.dtype, "Bias": self.dtype, "Out": self.dtype, "CU": self.cu_dtype, "Lse": "fp32",
               "ClsAttn": "fp32", "PosTable": "fp32", "TokPos": self.cu_dtype, "KeyBias": "fp32"}  # fmt: skip
        names = _FWD_ARGS if self.kernel == "fwd" else _CLS_ARGS
        sig = {n: ("*" + ptr[n]) if n in ptr else "i32" for n in names}
        consts = {"BLOCK_N": self.block_n, "BLOCK_D": self.block_d}
        if self.kernel == "fwd":
            consts = {"BLOCK_M": self.block_m, **consts}
        consts["HAS_POS"] = self.has_pos
        if self.kernel == "cls":
            if self.cls_heads < 1:
                raise ValueError(f"{self}: a cls job needs cls_heads >= 1")
            consts["HG"] = self.cls_heads
        consts["HAS_KEY_BIAS"] = self.has_key_bias
        sig.update({k: "constexpr" for k in consts})
        return sig, consts


@dataclass(frozen=True)
class AotResult:
    job: Any  # AotJob, or _aot_linear.LinearJob
    cubin: bytes
    function_name: str
    shared_bytes: int
    num_warps: int
    num_params: int  # including Triton's trailing global/profile scratch pointers


def _load_module(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def kernel_configs() -> list[dict[str, Any]]:
    """Launch configs from raggedvit/kernels/_config.py:aot_configs() (the fallback dict when unavailable).

    Each: dtype, block_d, min_tokens (used for T >= min_tokens; the largest such wins), block_m, block_n,
    num_warps, num_stages, cls_block_n, cls_num_warps, cls_heads.
    """
    keys = ("block_d", "block_m", "block_n", "num_warps", "num_stages", "cls_block_n", "cls_num_warps", "cls_heads")
    try:
        module = _load_module(CONFIG_SOURCE, "_raggedvit_aot_config")
        return [
            {"dtype": c.dtype, "min_tokens": int(getattr(c, "min_tokens", 0)), **{k: int(getattr(c, k)) for k in keys}}
            for c in module.aot_configs(BLOCK_DS)
        ]
    except (ImportError, AttributeError, FileNotFoundError) as exc:
        print(f"build: using the fallback kernel config ({exc})", file=sys.stderr)
        return [{"dtype": dt, "block_d": bd, "min_tokens": 0, **FALLBACK_CONFIG} for dt in DTYPES for bd in BLOCK_DS]


def make_plan(archs: tuple[int, ...]) -> tuple[list[AotJob], list[tuple[AotJob, int]]]:
    """Unique compile jobs, and the kernel table rows (job, min_tokens): every kernel x config x cu dtype x arch x
    BIAS_VARIANTS.

    Configs that differ only in min_tokens share a job (the cls kernel usually does).
    """
    rows: list[tuple[AotJob, int]] = []
    for arch in archs:
        for c in kernel_configs():
            for cu in CU_DTYPES:
                for has_pos, has_key_bias in BIAS_VARIANTS:
                    fwd = AotJob(
                        "fwd",
                        c["dtype"],
                        cu,
                        c["block_d"],
                        arch,
                        c["block_m"],
                        c["block_n"],
                        c["num_warps"],
                        c["num_stages"],
                        has_pos,
                        has_key_bias=has_key_bias,
                    )
                    cls = AotJob(
                        "cls", c["dtype"], cu, c["block_d"], arch, 0, c["cls_block_n"], c["cls_num_warps"], 1, has_pos,
                        c["cls_heads"], has_key_bias,
                    )  # fmt: skip
                    rows += [(fwd, c["min_tokens"]), (cls, c["min_tokens"])]
    rows = list(dict.fromkeys(rows))  # identical (job, min_tokens) rows once
    jobs = list(dict.fromkeys(job for job, _ in rows))
    return jobs, rows


def cache_key(job: Any) -> str:
    """Hash of (the job's kernel source, triton version, job fields)."""
    import triton

    h = hashlib.sha256()
    h.update(job.source.read_bytes())
    h.update(triton.__version__.encode())
    h.update(json.dumps(asdict(job), sort_keys=True).encode())
    h.update(b"aot-v1")
    return h.hexdigest()[:24]


class _StubDriver:
    """Minimal active driver: reports the target to compile for (no GPU access)."""

    def __init__(self, arch: int) -> None:
        self.arch = arch

    def get_current_target(self) -> Any:
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", self.arch, 32)

    def map_python_to_cpp_type(self, ty: str) -> str:
        from triton.backends.nvidia.driver import ty_to_cpp

        return ty_to_cpp(ty)

    def get_active_torch_device(self) -> Any:
        raise RuntimeError("the AOT stub driver has no device")


def _count_ptx_params(ptx: str, function: str) -> int:
    m = re.search(r"\.entry\s+" + re.escape(function) + r"\s*\((.*?)\)", ptx, re.S)
    if m is None:
        raise RuntimeError(f"cannot find .entry {function} in the PTX")
    return len(re.findall(r"\.param\s", m.group(1)))


def _check_tensordesc(job: Any, meta: list[dict[str, Any]], sig: dict[str, str]) -> None:
    """The TMA descriptors the C++ launcher encodes (linear_launcher.cc: tiled, 2-D, 2-byte elements, 128-byte
    swizzle, boxes of the descriptor's rows x 64 columns) must be the ones the cubin was compiled for."""
    descs = [t for t in sig.values() if t.startswith("tensordesc")]
    if len(meta) != len(descs):
        raise RuntimeError(f"{job}: {len(descs)} tensor descriptors, {len(meta)} in the compiled metadata")
    for m, t in zip(meta, descs, strict=True):
        rows, cols = (int(v) for v in t[t.index("[") + 1 : t.index("]")].split(","))
        block = [rows, min(cols, 64)]  # a wider block is copied as several 64-column (128-byte) boxes
        swizzle_128b = 3  # CU_TENSOR_MAP_SWIZZLE_128B
        got = (m.get("swizzle"), m.get("elem_size"), list(m.get("block_size", [])), bool(m.get("fp4_padded")),
               bool(m.get("is_im2col")))  # fmt: skip
        if got != (swizzle_128b, 2, block, False, False):
            raise RuntimeError(f"{job}: descriptor {t} compiled as {m}; the launcher encodes 128B-swizzled tiles")


def _compile(job: Any) -> AotResult:
    import triton
    from triton.backends.compiler import GPUTarget

    triton.runtime.driver.set_active(_StubDriver(job.arch))
    module = _load_module(job.source, f"_raggedvit_aot_{job.source.stem}")
    fn = getattr(module, job.function)
    sig, consts = job.signature()
    names = list(sig)
    attrs = {
        (i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if sig[n].startswith("*") or n in job.hinted_ints
    }
    src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    target = GPUTarget("cuda", job.arch, 32)
    backend = triton.compiler.make_backend(target)
    options = backend.parse_options({"num_warps": job.num_warps, "num_stages": job.num_stages})
    compiled = triton.compile(src, target=target, options=options.__dict__)
    md = compiled.metadata
    if getattr(md, "global_scratch_size", 0) or getattr(md, "profile_scratch_size", 0):
        raise RuntimeError(f"{job}: kernels needing global/profile scratch are not supported by the launcher")
    n_params = _count_ptx_params(compiled.asm["ptx"], md.name)
    # a 2-D TMA descriptor is 5 params (its CUtensorMap, 2 sizes, 2 strides); + global and profile scratch
    expected = sum(5 if t.startswith("tensordesc") else 1 for t in sig.values() if t != "constexpr") + 2
    _check_tensordesc(job, getattr(md, "tensordesc_meta", None) or [], sig)
    if n_params != expected:
        raise RuntimeError(f"{job}: cubin has {n_params} params, the launcher passes {expected}")
    return AotResult(job, bytes(compiled.asm["cubin"]), md.name, int(md.shared), int(md.num_warps), n_params)


def compile_job(job: Any, cache_dir: Path) -> tuple[AotResult, bool]:
    """Compiled kernel of `job` (from the cache when present) and whether it came from the cache."""
    key = cache_key(job)
    meta_path, bin_path = cache_dir / f"{key}.json", cache_dir / f"{key}.cubin"
    if meta_path.exists() and bin_path.exists():
        meta = json.loads(meta_path.read_text())
        return AotResult(
            job,
            bin_path.read_bytes(),
            meta["function_name"],
            meta["shared_bytes"],
            meta["num_warps"],
            meta["num_params"],
        ), True
    result = _compile(job)
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = bin_path.with_suffix(f".tmp{id(result)}")
    tmp.write_bytes(result.cubin)
    tmp.replace(bin_path)
    meta = {
        "job": asdict(job),
        "function_name": result.function_name,
        "shared_bytes": result.shared_bytes,
        "num_warps": result.num_warps,
        "num_params": result.num_params,
    }
    tmp_meta = meta_path.with_suffix(f".tmp{id(result)}")
    tmp_meta.write_text(json.dumps(meta, indent=1))
    tmp_meta.replace(meta_path)
    return result, False
