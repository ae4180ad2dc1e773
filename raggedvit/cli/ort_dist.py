"""Which ONNX Runtime distribution provides the `onnxruntime` module.

raggedvit names no runtime in its base requirements: the extra "cpu" brings `onnxruntime`, "gpu" brings
`onnxruntime-gpu`. Both install the same `onnxruntime` package, so with both installed the one installed
last has overwritten the other's files; `conflict()` says so, and `require_onnxruntime()` turns a missing
or broken runtime into one OnnxRuntimeMissing error that says how to install one.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

__all__ = [
    "DISTRIBUTIONS",
    "OnnxRuntimeMissing",
    "RuntimeStatus",
    "conflict",
    "installed",
    "module_owner",
    "require_onnxruntime",
    "status",
]

DISTRIBUTIONS = ("onnxruntime", "onnxruntime-gpu")
INSTALL_HINT = "install one: pip install 'raggedvit[cpu]' (onnxruntime) or 'raggedvit[gpu]' (onnxruntime-gpu)"


class OnnxRuntimeMissing(ImportError):
    """The `onnxruntime` module cannot be imported (no ONNX Runtime distribution, or a broken one)."""


def installed() -> dict[str, str]:
    """{distribution: version} of the ONNX Runtime distributions installed (metadata, no import)."""
    found = {}
    for dist in DISTRIBUTIONS:
        try:
            found[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    return found


def module_owner() -> str | None:
    """The installed distribution whose files the importable `onnxruntime` module is; None if unknown."""
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or spec.origin is None:
        return None
    origin = Path(spec.origin).resolve()
    for dist in installed():
        try:
            init = md.distribution(dist).locate_file("onnxruntime/__init__.py")
        except md.PackageNotFoundError:
            continue
        if Path(str(init)).resolve() == origin:
            return dist
    return None


def conflict(dists: dict[str, str] | None = None) -> str | None:
    """A warning when more than one ONNX Runtime distribution is installed, else None."""
    dists = installed() if dists is None else dists
    if len(dists) < 2:
        return None
    names = " and ".join(f"{d} {v}" for d, v in dists.items())
    return (
        f"{names} are installed; they provide the same `onnxruntime` module and the one installed last wins. "
        f"Keep one: pip uninstall -y {' '.join(dists)}, then install the one you want"
    )


def require_onnxruntime() -> ModuleType:
    """The `onnxruntime` module; OnnxRuntimeMissing (with the install command) if it cannot be imported."""
    try:
        import onnxruntime
    except ImportError as e:
        dists = installed()
        if not dists:
            raise OnnxRuntimeMissing(f"ONNX Runtime is not installed; {INSTALL_HINT}") from None
        names = ", ".join(f"{d} {v}" for d, v in dists.items())
        raise OnnxRuntimeMissing(f"{names} installed, but `import onnxruntime` fails ({e}); reinstall it") from None
    return onnxruntime


@dataclass(frozen=True)
class RuntimeStatus:
    """What `raggedvit info` reports about ONNX Runtime."""

    distributions: dict[str, str]  # installed ONNX Runtime distributions and their versions
    owner: str | None  # the distribution the importable module belongs to
    version: str | None  # onnxruntime.__version__, None if it cannot be imported
    providers: list[str]
    error: str | None  # why it cannot be imported
    warning: str | None  # conflict()

    def describe(self) -> str:
        """One line: "1.32.0 (onnxruntime)", "1.31.1 (onnxruntime-gpu; also installed: onnxruntime 1.30.0)"."""
        if self.version is None:
            return str(self.error)
        others = [f"{d} {v}" for d, v in self.distributions.items() if d != self.owner]
        also = f"; also installed: {', '.join(others)}" if others else ""
        return f"{self.version} ({self.owner or 'no distribution metadata'}{also})"


def status() -> RuntimeStatus:
    """Installed distributions, the imported one, its version and execution providers (imports onnxruntime)."""
    dists = installed()
    try:
        ort = require_onnxruntime()
    except OnnxRuntimeMissing as e:
        return RuntimeStatus(dists, None, None, [], str(e), conflict(dists))
    providers = list(ort.get_available_providers())
    return RuntimeStatus(dists, module_owner(), ort.__version__, providers, None, conflict(dists))
