"""Builds libraggedvit_ort.so: Triton AOT cubins of raggedvit/kernels/_kernel.py, _linear_kernel.py (the ragged
linear and the bias + GELU kernels), _select_kernel.py, _norm_kernel.py, _embed_kernel.py and _merge_kernel.py + the
C++ op library.

    python raggedvit/custom_ops/build.py --output PATH [--archs 80,86,89,90] [--jobs N]

Steps: compile every attention kernel x dtype x cu dtype x BLOCK_D x arch and every linear dtype x cu dtype x
config x arch to cubin (parallel processes, cached under build/aot-cache; linear configs above an arch's shared
memory limit are dropped), emit a C++ source with the cubins as byte arrays, then g++ everything into one
shared library (no libonnxruntime and no CUDA library at link time; libcuda is opened at run time).
Runs inside `pip install`, so it imports neither torch nor raggedvit's runtime modules.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # the AOT build compiles real kernels, whatever the caller's setting
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from raggedvit.custom_ops import (  # noqa: E402
    _aot,
    _aot_embed,
    _aot_linear,
    _aot_merge,
    _aot_norm,
    _aot_select,
    _codegen,
    _ort_headers,
)

SOURCES = (
    "ragged_attention.cc",
    "ragged_linear.cc",
    "ragged_select.cc",
    "ragged_merge.cc",
    "bias_gelu.cc",
    "gather_layer_norm.cc",
    "patch_embed.cc",
    "cpu/ragged_attention_cpu.cc",
    "cpu/patch_embed_cpu.cc",
    "cpu/gather_layer_norm_cpu.cc",
    "cpu/bias_gelu_cpu.cc",
    "cpu/ragged_linear_cpu.cc",
    "cpu/ragged_select_cpu.cc",
    "cpu/ragged_merge_cpu.cc",
    "cuda/ragged_attention_cuda.cc",
    "cuda/ragged_linear_cuda.cc",
    "cuda/launcher.cc",
    "cuda/linear_launcher.cc",
    "cuda/ragged_select_cuda.cc",
    "cuda/select_launcher.cc",
    "cuda/ragged_merge_cuda.cc",
    "cuda/merge_launcher.cc",
    "cuda/bias_gelu_cuda.cc",
    "cuda/gelu_launcher.cc",
    "cuda/gather_layer_norm_cuda.cc",
    "cuda/norm_launcher.cc",
    "cuda/patch_embed_cuda.cc",
    "cuda/embed_launcher.cc",
    "registration.cc",
)
CXXFLAGS = [
    "-O3",
    "-std=c++17",
    "-fPIC",
    "-fvisibility=hidden",
    "-DORT_API_MANUAL_INIT",
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
]
LIBS = ["-ldl", "-lpthread"]


def _version() -> str:
    text = (ROOT / "raggedvit" / "__init__.py").read_text()
    m = re.search(r'__version__\s*=\s*"([^"]+)"', text)
    return m.group(1) if m else "0"


def _cuda_include() -> Path:
    import triton

    path = Path(triton.__file__).resolve().parent / "backends" / "nvidia" / "include"
    if not (path / "cuda.h").is_file():
        raise SystemExit(f"build: cuda.h not found in the triton wheel ({path})")
    return path


def _worker_init() -> None:
    os.environ["TRITON_DISABLE_LINE_INFO"] = "1"


def _compile_one(job: _aot.AotJob, cache_dir: Path) -> tuple[_aot.AotResult, bool]:
    return _aot.compile_job(job, cache_dir)


@dataclass
class Cubins:
    """Every compiled kernel of a build: the attention table rows (result, min_tokens), the linear cubins that fit
    their arch's shared memory and those skipped for exceeding it, the selection, bias + GELU, gather + LayerNorm
    and patch embedding cubins."""

    rows: list[tuple[_aot.AotResult, int]] = field(default_factory=list)
    linear: list[_aot.AotResult] = field(default_factory=list)
    skipped: list[_aot.AotResult] = field(default_factory=list)
    select: list[_aot.AotResult] = field(default_factory=list)
    gelu: list[_aot.AotResult] = field(default_factory=list)
    norm: list[_aot.AotResult] = field(default_factory=list)
    embed: list[_aot.AotResult] = field(default_factory=list)
    merge: list[_aot.AotResult] = field(default_factory=list)


def compile_cubins(archs: tuple[int, ...], jobs: int, cache_dir: Path) -> Cubins:
    """Compiles (or loads from the cache) every kernel of `archs`."""
    work, rows = _aot.make_plan(archs)
    linear_work = _aot_linear.make_linear_plan(archs)
    select_work = _aot_select.make_select_plan(archs)
    gelu_work = _aot_linear.make_gelu_plan(archs)
    norm_work = _aot_norm.make_norm_plan(archs)
    embed_work = _aot_embed.make_embed_plan(archs)
    merge_work = _aot_merge.make_merge_plan(archs)
    if not work and not linear_work:
        return Cubins()
    os.environ["TRITON_DISABLE_LINE_INFO"] = "1"
    # most expensive first (forward kernels, wide heads, large linear tiles), so two workers finish together
    order = sorted(work, key=lambda j: (j.kernel != "fwd", -j.block_d, j.dtype != "fp32"))
    order = sorted(linear_work, key=lambda j: -j.block_m * j.block_n) + order + embed_work + select_work
    order += merge_work + gelu_work + norm_work
    with ProcessPoolExecutor(max_workers=jobs, initializer=_worker_init) as pool:
        futures = {job: pool.submit(_compile_one, job, cache_dir) for job in order}
        done = {job: f.result() for job, f in futures.items()}
    hits = sum(1 for _, cached in done.values() if cached)
    fits = {job: _aot_linear.fits_arch(job, done[job][0].shared_bytes) for job in linear_work + embed_work}
    out = Cubins(
        rows=[(done[job][0], min_tokens) for job, min_tokens in rows],
        linear=[done[job][0] for job in linear_work if fits[job]],
        skipped=[done[job][0] for job in linear_work if not fits[job]],
        select=[done[job][0] for job in select_work],
        gelu=[done[job][0] for job in gelu_work],
        norm=[done[job][0] for job in norm_work],
        embed=[done[job][0] for job in embed_work if fits[job]],
        merge=[done[job][0] for job in merge_work],
    )
    print(
        f"build: {len(done)} cubins ({hits} from cache), {len(rows)} kernel table rows, {len(out.linear)} linear "
        f"kernel rows ({len(out.skipped)} skipped: shared memory above the arch limit), {len(select_work)} select "
        f"rows, {len(gelu_work)} bias-GELU rows, {len(norm_work)} gather-LayerNorm rows, {len(out.embed)} "
        f"patch-embedding rows, {len(merge_work)} merge rows, for sm_{', sm_'.join(map(str, archs))}",
        flush=True,
    )
    return out


def _compile_object(src: Path, obj_dir: Path, flags: list[str]) -> tuple[Path, subprocess.Popen | None]:
    """Starts g++ for src unless an object with the same (source, flags, headers) hash exists."""
    h = hashlib.sha256(src.read_bytes() + " ".join(flags).encode())
    for header in sorted(HERE.rglob("*.h")):
        h.update(header.read_bytes())
    obj = obj_dir / f"{src.stem}-{h.hexdigest()[:16]}.o"
    if obj.exists():
        return obj, None
    tmp = obj.with_suffix(f".tmp{os.getpid()}.o")
    return obj, subprocess.Popen(["g++", *flags, "-c", str(src), "-o", str(tmp)])


def compile_library(output: Path, generated: Path, ort_include: Path, cuda_include: Path, obj_dir: Path) -> None:
    obj_dir.mkdir(parents=True, exist_ok=True)
    flags = [*CXXFLAGS, f"-I{ort_include}", f"-I{cuda_include}", f"-I{HERE}", f"-I{HERE / 'cuda'}"]
    started = [_compile_object(HERE / s, obj_dir, flags) for s in SOURCES]
    started.append(_compile_object(generated, obj_dir, [f for f in flags if not f.startswith("-W")] + ["-O0"]))
    for obj, proc in started:
        if proc is not None:
            if proc.wait() != 0:
                raise SystemExit(f"build: g++ failed for {obj.name}")
            obj.with_suffix(f".tmp{os.getpid()}.o").replace(obj)
    tmp = output.with_name(f"{output.name}.tmp{os.getpid()}")
    cmd = ["g++", "-shared", "-Wl,--no-undefined", "-o", str(tmp), *(str(o) for o, _ in started), *LIBS]
    subprocess.run(cmd, check=True)
    tmp.replace(output)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, required=True, help="path of the .so to write")
    parser.add_argument("--archs", default="80,86,89,90", help="comma-separated SM archs; '' or 'none' for CPU only")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel compile processes")
    parser.add_argument("--build-dir", type=Path, default=ROOT / "build", help="caches and generated sources")
    args = parser.parse_args(argv)
    try:
        archs = tuple(int(a) for a in args.archs.replace(" ", "").split(",") if a and a != "none")
    except ValueError:
        parser.error(f"--archs must be comma-separated SM numbers like 80,86,89,90, got {args.archs!r}")
    if any(a < 80 for a in archs):
        parser.error(f"--archs: the kernels need sm_80 or newer, got {args.archs!r}")
    t0 = time.perf_counter()
    build_dir = args.build_dir.resolve()
    try:
        ort_include = _ort_headers.find_ort_headers(build_dir)
    except _ort_headers.OrtHeadersNotFound as exc:
        print(f"build: {exc}", file=sys.stderr)
        return 2
    print(f"build: ORT headers {ort_include} (API {_ort_headers.header_api_version(ort_include)})", flush=True)
    c = compile_cubins(archs, max(1, args.jobs), build_dir / "aot-cache")
    t1 = time.perf_counter()

    import triton

    gen_dir = build_dir / "ort-gen" / hashlib.sha256(str(archs).encode()).hexdigest()[:8]
    gen_dir.mkdir(parents=True, exist_ok=True)
    generated = gen_dir / "cubins.cc"
    info = _codegen.build_info(c.rows, _version(), triton.__version__, c.linear, c.skipped, c.select, c.gelu, c.norm,
                               c.embed, c.merge)  # fmt: skip
    new_text = gen_dir / f"cubins.cc.new{os.getpid()}"
    _codegen.write_cubin_source(new_text, c.rows, info, c.linear, c.select, c.gelu, c.norm, c.embed, c.merge)
    if generated.exists() and generated.read_bytes() == new_text.read_bytes():
        new_text.unlink()
    else:
        new_text.replace(generated)
    output = args.output.resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    compile_library(output, generated, ort_include, _cuda_include(), build_dir / "ort-obj")
    t2 = time.perf_counter()
    size_mb = output.stat().st_size / 2**20
    print(f"build: wrote {output} ({size_mb:.1f} MiB; cubins {t1 - t0:.1f} s, C++ {t2 - t1:.1f} s)", flush=True)
    if shutil.which("ldd"):
        deps = subprocess.run(["ldd", str(output)], capture_output=True, text=True).stdout
        bad = [d for d in ("libcuda", "libcudart", "libonnxruntime") if d in deps]
        if bad:
            print(f"build: {output.name} links {bad}; it must not", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
