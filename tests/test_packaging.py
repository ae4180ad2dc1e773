"""Packaging metadata: no unconditional ONNX Runtime, one flavour per extra; scripts/check_wheel.py on good and
bad wheels (CI runs it on the built wheel)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECK = ROOT / "scripts" / "check_wheel.py"
LIBRARY = "raggedvit/custom_ops/libraggedvit_ort.so"


def test_pyproject_extras():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = [d.split(">")[0].split("=")[0].split("[")[0].strip() for d in project["dependencies"]]
    assert not {"onnxruntime", "onnxruntime-gpu"} & set(names)
    assert "onnxscript" in names
    extras = project["optional-dependencies"]
    assert [d for d in extras["cpu"] if d.startswith("onnxruntime")] == ["onnxruntime>=1.21"]
    assert [d for d in extras["gpu"] if d.startswith("onnxruntime")] == ["onnxruntime-gpu>=1.21"]
    assert any(d.startswith("onnxruntime>=") for d in extras["dev"])  # the tests run on the CPU runtime
    assert not any(d.startswith("onnxruntime-gpu") for d in extras["dev"])
    assert any(d.startswith("ray[serve]") for d in extras["serve"])  # raggedvit serve
    assert set(extras["serve"]) <= set(extras["dev"])  # CI runs the serving tests


def _wheel(tmp_path: Path, filename: str, requires: list[str], library: bool = True, extra: str = "") -> Path:
    wheel = tmp_path / filename
    metadata = "Metadata-Version: 2.4\nName: raggedvit\nVersion: 0.1.0\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("raggedvit-0.1.0.dist-info/METADATA", metadata)
        if library:
            zf.writestr(LIBRARY, b"\x7fELF")
        if extra:
            zf.writestr(extra, b"")
    return wheel


GOOD = [
    "torch<2.15,>=2.9",
    "triton<3.9,>=3.6",
    "timm<1.1,>=1.0.15",
    'onnxruntime>=1.21; extra == "cpu"',
    'onnxruntime-gpu>=1.21; extra == "gpu"',
]


def _check(wheel: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECK), str(wheel)], capture_output=True, text=True, timeout=60)


def test_check_wheel_accepts_a_good_wheel(tmp_path):
    res = _check(_wheel(tmp_path, "raggedvit-0.1.0-py3-none-manylinux_2_34_x86_64.whl", GOOD))
    assert res.returncode == 0 and "OK" in res.stdout, res.stderr


@pytest.mark.parametrize(
    "filename,requires,library,fragment",
    [
        ("raggedvit-0.1.0-py3-none-any.whl", GOOD, True, "expected py3-none-<platform>"),
        ("raggedvit-0.1.0-cp311-cp311-linux_x86_64.whl", GOOD, True, "expected py3-none-<platform>"),
        ("raggedvit-0.1.0-py3-none-linux_x86_64.whl", GOOD, False, "is not in the wheel"),
        ("raggedvit-0.1.0-py3-none-linux_x86_64.whl", [*GOOD, "onnxruntime>=1.21"], True, "unconditional"),
        ("raggedvit-0.1.0-py3-none-linux_x86_64.whl", GOOD[:4], True, 'extra "gpu" does not require onnxruntime-gpu'),
        ("raggedvit-0.1.0-py3-none-linux_x86_64.whl", ["triton>=3.6", *GOOD[2:]], True, "triton is not required with"),
        (
            "raggedvit-0.1.0-py3-none-linux_x86_64.whl",
            [*GOOD, 'onnxruntime; extra == "gpu"'],
            True,
            'extra "gpu" also requires onnxruntime',
        ),
    ],
)
def test_check_wheel_rejects(tmp_path, filename, requires, library, fragment):
    res = _check(_wheel(tmp_path, filename, requires, library))
    assert res.returncode == 1 and fragment in res.stderr, res.stderr


@pytest.mark.parametrize(
    "module", ["raggedvit/custom_ops/_fuzz_cases.py", "raggedvit/testing.py", "raggedvit/pruning/padded.py"]
)
def test_check_wheel_rejects_test_only_code(tmp_path, module):
    res = _check(_wheel(tmp_path, "raggedvit-0.1.0-py3-none-linux_x86_64.whl", GOOD, extra=module))
    assert res.returncode == 1 and f"{module} is test-only code" in res.stderr, res.stderr
