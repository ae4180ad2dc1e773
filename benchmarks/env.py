"""What a result file records about the machine and the software that produced it."""

from __future__ import annotations

import datetime as dt
import importlib.metadata as md
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["environment", "probe_result_path"]

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
    """GPU (name, driver), package versions, date (UTC), commit (env RAGGEDVIT_COMMIT or git), host."""
    import torch

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
        "python": platform.python_version(),
        "cpu_cores": os.cpu_count(),
        "packages": {name: _version(name) for name in _PACKAGES},
    }


def probe_result_path(out: str | Path, name: str) -> Path:
    """`out`/<name>_<date>_<GPU name, spaces as dashes>.json for a probe's results; `out` is created."""
    import torch

    gpu = torch.cuda.get_device_name(0).replace(" ", "-")
    path = Path(out) / f"{name}_{dt.date.today().isoformat()}_{gpu}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path
