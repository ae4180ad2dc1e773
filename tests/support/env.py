"""The environment of a child process that a test starts: the checkout first on PYTHONPATH, the inherited entries
after it (a GPU machine may bring onnxruntime-gpu or other packages through PYTHONPATH; dropping them makes the child
import another onnxruntime than the test's own)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["ROOT", "child_env"]

ROOT = Path(__file__).resolve().parents[2]


def child_env(*first: str | Path, **extra: str) -> dict[str, str]:
    """os.environ with PYTHONPATH = `first` (default: the checkout's root), then the inherited PYTHONPATH entries;
    `extra` set last."""
    paths = [str(p) for p in (first or (ROOT,))]
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in paths]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths + inherited), **extra}
