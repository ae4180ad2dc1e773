"""What a result file records about the machine and the software that produced it."""

from __future__ import annotations

import datetime as dt
import importlib.metadata as md
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["environment", "machine_slug", "result_path"]

_PACKAGES = ("torch", "triton", "onnxruntime-gpu", "onnxruntime", "onnx", "onnxscript", "onnx-ir", "timm")


def _version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def _commit() -> str | None:
    if os.environ.get("RAGGEDVIT_COMMIT"):
        return os.environ["RAGGEDVIT_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def environment() -> dict[str, Any]:
    """GPU (name, driver), CPU (model and cores), package versions, date (UTC), commit (env RAGGEDVIT_COMMIT or git),
    host."""
    import torch

    from raggedvit.timing import cpu_name

    gpu = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        gpu = {"name": props.name, "sm": f"{props.major}{props.minor}", "multiprocessors": props.multi_processor_count}
        try:
            smi = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            gpu["driver"] = smi.stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            gpu["driver"] = None
    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": _commit(),
        "gpu": gpu,
        "cpu": cpu_name(),
        "python": platform.python_version(),
        "cpu_cores": os.cpu_count(),
        "packages": {name: _version(name) for name in _PACKAGES},
    }


def machine_slug(name: str | None) -> str:
    """A GPU (or "cpu") name as a file-name part: runs of other characters than letters and digits become "-"."""
    return re.sub(r"[^A-Za-z0-9]+", "-", name or "unknown").strip("-")


def result_path(out: str | Path, benchmark: str, machine: str | None, suffix: str = ".json") -> Path:
    """`out`/<benchmark>_<machine slug><suffix>: the canonical result file of one benchmark on one machine.

    A new run overwrites it in place (git keeps the earlier ones); `out` is created."""
    path = Path(out) / f"{benchmark}_{machine_slug(machine)}{suffix}"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path
