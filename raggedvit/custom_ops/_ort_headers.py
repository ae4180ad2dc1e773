"""Locates the ONNX Runtime C/C++ headers for the op library build (the onnxruntime wheels ship none).

Order, first usable (API version >= MIN_API_VERSION) wins:
1. $ORT_INCLUDE_DIR: a folder with onnxruntime_c_api.h and onnxruntime_cxx_api.h (e.g. the include/ of an ONNX
   Runtime release archive);
2. $ORT_DEV_DEB: a libonnxruntime-dev .deb, unpacked into the build folder;
3. pkg-config's include dirs of `libonnxruntime` (Debian's libonnxruntime-dev installs one);
4. the usual install prefixes: $CONDA_PREFIX/include, /usr/local/include, /usr/include (each with onnxruntime/ or
   onnxruntime/core/session/ under it);
5. the headers unpacked into the build folder by an earlier build;
6. `apt-get download libonnxruntime-dev` from Debian trixie with a private package list (no root needed).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["OrtHeadersNotFound", "find_ort_headers", "header_api_version"]

MIN_API_VERSION = 21
_DEB_GLOB = "libonnxruntime-dev_*.deb"
_TRIXIE = "deb http://deb.debian.org/debian trixie main\n"


class OrtHeadersNotFound(RuntimeError):
    """No usable onnxruntime_cxx_api.h was found or could be fetched."""


def header_api_version(include_dir: Path) -> int | None:
    """ORT_API_VERSION of the headers in include_dir, None if they are not there."""
    c_api = include_dir / "onnxruntime_c_api.h"
    if not (c_api.is_file() and (include_dir / "onnxruntime_cxx_api.h").is_file()):
        return None
    m = re.search(r"#define\s+ORT_API_VERSION\s+(\d+)", c_api.read_text(errors="replace"))
    return int(m.group(1)) if m else None


def _usable(include_dir: Path, tried: list[str]) -> bool:
    version = header_api_version(include_dir)
    if version is None:
        tried.append(f"{include_dir}: no onnxruntime_c_api.h / onnxruntime_cxx_api.h")
        return False
    if version < MIN_API_VERSION:
        tried.append(f"{include_dir}: ORT_API_VERSION {version} < {MIN_API_VERSION}")
        return False
    return True


def _extract_deb(deb: Path, cache: Path) -> Path:
    """Unpacks the .deb into cache (dpkg-deb -x) and returns its include/onnxruntime directory."""
    if shutil.which("dpkg-deb") is None:
        raise OrtHeadersNotFound(f"dpkg-deb is needed to unpack {deb}")
    tmp = Path(tempfile.mkdtemp(prefix="ort-deb-", dir=cache.parent))
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp)], check=True)
    if cache.exists():
        shutil.rmtree(cache)
    tmp.replace(cache)
    return cache / "usr" / "include" / "onnxruntime"


def _apt_download(workdir: Path) -> Path:
    """`apt-get download libonnxruntime-dev` from Debian trixie with private list and cache dirs."""
    workdir.mkdir(parents=True, exist_ok=True)
    sources = workdir / "sources.list"
    sources.write_text(_TRIXIE)
    for sub in ("lists/partial", "cache/archives/partial"):
        (workdir / sub).mkdir(parents=True, exist_ok=True)
    opts = [
        "-o",
        f"Dir::Etc::SourceList={sources}",
        "-o",
        "Dir::Etc::SourceParts=/dev/null",
        "-o",
        f"Dir::State::Lists={workdir / 'lists'}",
        "-o",
        f"Dir::Cache={workdir / 'cache'}",
        "-o",
        "Debug::NoLocking=1",
    ]
    subprocess.run(["apt-get", *opts, "update"], check=True, cwd=workdir)
    subprocess.run(["apt-get", *opts, "download", "libonnxruntime-dev"], check=True, cwd=workdir)
    debs = sorted(workdir.glob(_DEB_GLOB))
    if not debs:
        raise OrtHeadersNotFound("apt-get download libonnxruntime-dev produced no .deb")
    return debs[-1]


def _pkg_config_dirs(tried: list[str]) -> list[Path]:
    """The -I folders of `pkg-config --cflags-only-I libonnxruntime`, [] without pkg-config or the package."""
    if shutil.which("pkg-config") is None:
        tried.append("pkg-config: not found")
        return []
    res = subprocess.run(["pkg-config", "--cflags-only-I", "libonnxruntime"], capture_output=True, text=True)
    if res.returncode != 0:
        tried.append("pkg-config: no libonnxruntime")
        return []
    return [Path(flag[2:]) for flag in res.stdout.split() if flag.startswith("-I")]


def _prefix_dirs() -> list[Path]:
    """onnxruntime/ and onnxruntime/core/session/ under $CONDA_PREFIX/include, /usr/local/include, /usr/include."""
    prefixes = [Path(os.environ["CONDA_PREFIX"]) / "include"] if os.environ.get("CONDA_PREFIX") else []
    prefixes += [Path("/usr/local/include"), Path("/usr/include")]
    return [p / "onnxruntime" / sub for p in prefixes for sub in ("", "core/session")]


def find_ort_headers(build_dir: Path) -> Path:
    """Directory holding onnxruntime_cxx_api.h (API version >= MIN_API_VERSION); raises OrtHeadersNotFound, whose
    text lists every place tried. Unpacked .deb files go to build_dir / "ort-headers"."""
    tried: list[str] = []
    cache = build_dir / "ort-headers"
    cached = cache / "usr" / "include" / "onnxruntime"
    env = os.environ.get("ORT_INCLUDE_DIR")
    if env and _usable(Path(env), tried):
        return Path(env)
    deb = os.environ.get("ORT_DEV_DEB")
    if deb:
        if not Path(deb).is_file():
            tried.append(f"ORT_DEV_DEB={deb}: no such file")
        else:
            cache.parent.mkdir(parents=True, exist_ok=True)
            if _usable(_extract_deb(Path(deb), cache), tried):
                return cached
    for candidate in (*_pkg_config_dirs(tried), *_prefix_dirs(), cached):
        if _usable(candidate, tried):
            return candidate
    if shutil.which("apt-get"):
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            include = _extract_deb(_apt_download(build_dir / "apt"), cache)
            if _usable(include, tried):
                return include
        except (subprocess.CalledProcessError, OrtHeadersNotFound) as exc:
            tried.append(f"apt-get download libonnxruntime-dev (Debian trixie): {exc}")
    else:
        tried.append("apt-get: not found")
    raise OrtHeadersNotFound(
        "ONNX Runtime C/C++ headers not found; set ORT_INCLUDE_DIR to a directory with onnxruntime_cxx_api.h "
        f"(API >= {MIN_API_VERSION}), set ORT_DEV_DEB to a libonnxruntime-dev .deb, or install Debian's "
        "libonnxruntime-dev. Tried:\n  " + "\n  ".join(tried)
    )
