"""Check a built raggedvit wheel: its tag, its dependency metadata and the op library inside.

    python3 scripts/check_wheel.py dist/raggedvit-*.whl

- tag py3-none-<platform>, the platform not "any" (the wheel carries a native library);
- no unconditional onnxruntime requirement; the "cpu" extra names onnxruntime, "gpu" onnxruntime-gpu;
- torch, triton and timm required with an upper bound (raggedvit uses private APIs of each: raggedvit/_versions.py);
- raggedvit/custom_ops/libraggedvit_ort.so inside (scripts/ci_wheel_check.sh checks its archs once installed);
- no test-only module inside (fuzz, memcheck and op-model helpers, seeded cases, the padded reference: tests/).

Prints the tag and exits 0, or prints each problem and exits 1.
"""

from __future__ import annotations

import argparse
import re
import sys
import zipfile
from email.parser import HeaderParser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import parse_wheel_filename

LIBRARY = "raggedvit/custom_ops/libraggedvit_ort.so"
RUNTIMES = ("onnxruntime", "onnxruntime-gpu")
BOUNDED = ("torch", "triton", "timm")
TEST_ONLY = re.compile(r"_fuzz|_memcheck|_ort_models|_select_cases|testing\.py|padded")


def extras_naming(requirements: list[Requirement], name: str) -> set[str]:
    """Extras under which `name` is required ("" = unconditionally)."""
    found = set()
    for req in requirements:
        if req.name.lower() != name:
            continue
        marker = str(req.marker) if req.marker else ""
        extras = re.findall(r'extra == "([^"]+)"', marker)
        found.update(extras if extras else [""])
    return found


def problems(wheel: Path) -> list[str]:
    """What is wrong with `wheel` (empty if nothing)."""
    found = []
    _, _, _, tags = parse_wheel_filename(wheel.name)
    for tag in tags:
        if (tag.interpreter, tag.abi) != ("py3", "none") or tag.platform == "any":
            found.append(f"tag {tag}: expected py3-none-<platform> (a native library, no CPython ABI)")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        metadata_name = next((n for n in names if n.endswith(".dist-info/METADATA")), None)
        if metadata_name is None:
            return [*found, "no .dist-info/METADATA"]
        metadata = HeaderParser().parsestr(zf.read(metadata_name).decode())
        if LIBRARY not in names:
            found.append(f"{LIBRARY} is not in the wheel")
        found += [f"{n} is test-only code: it belongs in tests/" for n in names if TEST_ONLY.search(n)]
    requirements = [Requirement(r) for r in metadata.get_all("Requires-Dist") or []]
    for dist in BOUNDED:
        reqs = [r for r in requirements if r.name.lower() == dist and not r.marker]
        if not any(spec.operator in ("<", "<=", "==", "~=") for r in reqs for spec in r.specifier):
            found.append(f"{dist} is not required with an upper bound (raggedvit uses its private APIs)")
    for runtime in RUNTIMES:
        if "" in extras_naming(requirements, runtime):
            found.append(f"{runtime} is an unconditional requirement: it belongs in an extra")
    for extra, runtime in (("cpu", "onnxruntime"), ("gpu", "onnxruntime-gpu")):
        if extra not in extras_naming(requirements, runtime):
            found.append(f'extra "{extra}" does not require {runtime}')
        for other in set(RUNTIMES) - {runtime}:
            if extra in extras_naming(requirements, other):
                found.append(f'extra "{extra}" also requires {other}: both provide the onnxruntime module')
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("wheel", type=Path)
    args = parser.parse_args(argv)
    found = problems(args.wheel)
    for problem in found:
        print(f"{args.wheel.name}: {problem}", file=sys.stderr)
    if not found:
        print(f"{args.wheel.name}: tag, dependency metadata and op library OK")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
