"""The ONNX Runtime op library `libraggedvit_ort.so` (com.raggedvit::RaggedAttention, CPU and CUDA EPs).

Built by `build.py` during `pip install -e .`; this module only locates and describes it (no torch).
"""

from __future__ import annotations

import ctypes
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["LIBRARY_NAME", "OpLibraryNotBuilt", "cubin_summary", "library_info", "library_path"]

LIBRARY_NAME = "libraggedvit_ort.so"
_HERE = Path(__file__).resolve().parent


class OpLibraryNotBuilt(FileNotFoundError):
    """libraggedvit_ort.so was not built (or RAGGEDVIT_ORT_LIBRARY points nowhere)."""


def library_path() -> str:
    """Absolute path of libraggedvit_ort.so ($RAGGEDVIT_ORT_LIBRARY overrides the packaged one)."""
    override = os.environ.get("RAGGEDVIT_ORT_LIBRARY")
    path = Path(override) if override else _HERE / LIBRARY_NAME
    if not path.is_file():
        raise OpLibraryNotBuilt(
            f"{path} does not exist: build it with `pip install --no-build-isolation -e .` or "
            f"`python raggedvit/custom_ops/build.py --output {_HERE / LIBRARY_NAME}`"
        )
    return str(path)


def library_info() -> dict[str, Any]:
    """raggedvit_ort_info() of the library: version, archs, dtypes, head-dim blocks, kernel configs."""
    lib = ctypes.CDLL(library_path())
    fn = lib.raggedvit_ort_info
    fn.restype = ctypes.c_char_p
    info = json.loads(fn().decode())
    info["path"] = library_path()
    return info


# the build info's part of each op's cubins ("" is the top level: attention), in the order of the ops list
_CUBIN_PARTS = (
    ("RaggedAttention", ""),
    ("RaggedLinear", "linear"),
    ("RaggedSelect", "select"),
    ("BiasGelu", "gelu"),
    ("GatherLayerNorm", "norm"),
    ("PatchEmbed", "embed"),
    ("RaggedMerge", "merge"),
)


def cubin_summary(build: dict[str, Any]) -> list[tuple[str, int, int, list[int]]]:
    """(op, cubins, cubin bytes, archs) per CUDA op of library_info()["build"]; a CPU-only build has 0 of each."""
    out = []
    for op, key in _CUBIN_PARTS:
        part = build.get(key, {}) if key else build
        out.append((op, int(part.get("num_cubins", 0)), int(part.get("cubin_bytes", 0)), list(part.get("archs", []))))
    return out
