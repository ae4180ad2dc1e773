"""Locates libraggedvit_ort.so for tests, building it once (under a file lock, for pytest-xdist) if missing."""

from __future__ import annotations

import fcntl
import subprocess
import sys
from pathlib import Path

from raggedvit.custom_ops import LIBRARY_NAME, OpLibraryNotBuilt, library_path

__all__ = ["ensure_library"]

ROOT = Path(__file__).resolve().parents[2]


def ensure_library() -> str:
    """library_path(), after running build.py when the library does not exist yet."""
    try:
        return library_path()
    except OpLibraryNotBuilt:
        pass
    target = ROOT / "raggedvit" / "custom_ops" / LIBRARY_NAME
    (ROOT / "build").mkdir(exist_ok=True)
    with open(ROOT / "build" / ".ort-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():
            subprocess.run(
                [sys.executable, str(ROOT / "raggedvit/custom_ops/build.py"), "--output", str(target)],
                check=True,
                cwd=ROOT,
            )
    return library_path()
