"""The dependency versions raggedvit supports, and a check of the installed ones.

Private APIs of other libraries tie raggedvit to a range of their versions: Triton's launcher convention and active
driver (`kernels/_launch.py`, `custom_ops/_aot.py`), `torch._C._cuda_getCurrentRawStream` (`kernels/_launch.py`),
torch.onnx's `ONNXRegistry.from_torchlib` (`exporter/_registry.py`, which falls back to torch's own behaviour) and
timm's `VisionTransformer._pos_embed` (`pruning/_model.py`, `pruning/families/eva.py`). `SUPPORTED` is the range tested
(its lower bounds as before, its upper bounds one minor past the newest tested version); pyproject.toml states the same
bounds (a test checks they agree). `raggedvit info` prints `check_versions()`'s warnings; CI runs this module
(`python -m raggedvit._versions`), which exits 1 outside the range.
"""

from __future__ import annotations

import importlib.metadata as md
import re
import sys
from dataclasses import dataclass

__all__ = ["SUPPORTED", "Bound", "check_versions", "parse_version"]


@dataclass(frozen=True)
class Bound:
    """min <= version < below (release numbers only: local tags such as +cu130 are ignored)."""

    min: tuple[int, ...]
    below: tuple[int, ...]
    why: str

    def spec(self) -> str:
        return f">={'.'.join(map(str, self.min))},<{'.'.join(map(str, self.below))}"

    def contains(self, version: tuple[int, ...]) -> bool:
        return self.min <= version < self.below


SUPPORTED: dict[str, Bound] = {
    "torch": Bound(
        (2, 9), (2, 15), "torch._C._cuda_getCurrentRawStream, torch.onnx's ONNXRegistry (tested 2.11 to 2.14)"
    ),
    "triton": Bound((3, 6), (3, 9), "Triton's launcher convention and active driver (tested 3.6 to 3.8)"),
    "timm": Bound((1, 0, 15), (1, 1), "timm's VisionTransformer._pos_embed (tested 1.0.29 to 1.0.31)"),
}


def parse_version(text: str) -> tuple[int, ...]:
    """The release numbers of a version string: "2.14.1+cu130" -> (2, 14, 1), "3.8.0rc1" -> (3, 8, 0)."""
    parts = []
    for piece in text.split("+")[0].split("."):
        m = re.match(r"\d+", piece)
        if m is None:
            break
        parts.append(int(m.group()))
        if m.end() != len(piece):
            break
    return tuple(parts)


def check_versions(installed: dict[str, str] | None = None) -> list[str]:
    """One warning per installed dependency outside `SUPPORTED` (naming the supported range and why); [] when all
    are inside. `installed` maps distribution names to versions (default: the installed distributions; one not
    installed is skipped)."""
    if installed is None:
        installed = {}
        for dist in SUPPORTED:
            try:
                installed[dist] = md.version(dist)
            except md.PackageNotFoundError:
                continue
    warnings = []
    for dist, version in installed.items():
        bound = SUPPORTED.get(dist)
        if bound is not None and not bound.contains(parse_version(version)):
            warnings.append(f"{dist} {version} is outside the supported range {dist}{bound.spec()} ({bound.why})")
    return warnings


if __name__ == "__main__":
    problems = check_versions()
    for line in problems:
        print(f"error: {line}", file=sys.stderr)
    print("dependency versions: " + ("outside the supported range" if problems else "inside the supported range"))
    sys.exit(1 if problems else 0)
