"""Locates the ONNX Runtime C/C++ headers for the op library build (no Python wheel ships them).

Order: $ORT_INCLUDE_DIR; /usr/include/onnxruntime (Debian libonnxruntime-dev); a cache under build/;
a libonnxruntime-dev_*.deb under ../shared/device/ (relative to the repo root); `apt-get download
libonnxruntime-dev` from Debian trixie with a private package list.
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


def find_ort_headers(repo_root: Path, build_dir: Path) -> Path:
    """Directory holding onnxruntime_cxx_api.h (API version >= 21); raises OrtHeadersNotFound."""
    tried: list[str] = []
    env = os.environ.get("ORT_INCLUDE_DIR")
    if env:
        if _usable(Path(env), tried):
            return Path(env)
    for candidate in (Path("/usr/include/onnxruntime"), build_dir / "ort-headers" / "usr" / "include" / "onnxruntime"):
        if _usable(candidate, tried):
            return candidate
    cache = build_dir / "ort-headers"
    cache.parent.mkdir(parents=True, exist_ok=True)
    debs = sorted((repo_root.parent / "shared" / "device").glob(_DEB_GLOB))
    if debs:
        include = _extract_deb(debs[-1], cache)
        if _usable(include, tried):
            return include
    else:
        tried.append(f"{repo_root.parent / 'shared' / 'device'}: no {_DEB_GLOB}")
    if shutil.which("apt-get"):
        try:
            include = _extract_deb(_apt_download(build_dir / "apt"), cache)
            if _usable(include, tried):
                return include
        except (subprocess.CalledProcessError, OrtHeadersNotFound) as exc:
            tried.append(f"apt-get download libonnxruntime-dev (Debian trixie): {exc}")
    else:
        tried.append("apt-get: not found")
    raise OrtHeadersNotFound(
        "ONNX Runtime C/C++ headers not found; set ORT_INCLUDE_DIR to a directory with onnxruntime_cxx_api.h "
        "(API >= 21) or install Debian's libonnxruntime-dev. Tried:\n  " + "\n  ".join(tried)
    )
