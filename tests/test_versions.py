"""raggedvit._versions: the supported dependency range, its agreement with pyproject.toml, and `raggedvit info`'s
warning outside it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from raggedvit._versions import SUPPORTED, check_versions, parse_version

_ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("text", "want"),
    [("2.14.1+cu130", (2, 14, 1)), ("3.8.0", (3, 8, 0)), ("3.9.0rc1", (3, 9, 0)), ("1.0.31", (1, 0, 31)),
     ("2.15.0.dev20260101", (2, 15, 0))],
)  # fmt: skip
def test_parse_version(text, want):
    assert parse_version(text) == want


def test_versions_inside_and_outside_the_range():
    assert check_versions({"torch": "2.11.0", "triton": "3.6.0", "timm": "1.0.29"}) == []
    assert check_versions({"torch": "2.14.1+cu130", "triton": "3.8.0", "timm": "1.0.31"}) == []
    (warning,) = check_versions({"torch": "2.14.1", "triton": "3.9.0", "timm": "1.0.31"})
    assert warning.startswith("triton 3.9.0 is outside the supported range triton>=3.6,<3.9")
    assert "launcher" in warning
    assert len(check_versions({"torch": "2.8.0", "triton": "3.5.1", "timm": "1.1.0"})) == 3


def test_pyproject_states_the_same_bounds():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    project = tomllib.loads((_ROOT / "pyproject.toml").read_text())
    deps = {re.match(r"[A-Za-z0-9_.-]+", d).group(): d for d in project["project"]["dependencies"]}
    for dist, bound in SUPPORTED.items():
        assert deps[dist] == f"{dist}{bound.spec()}", deps[dist]
    (build_triton,) = [r for r in project["build-system"]["requires"] if r.startswith("triton")]
    assert build_triton == f"triton{SUPPORTED['triton'].spec()}"


def test_info_warns_outside_the_range(monkeypatch):
    import importlib.metadata as md

    from click.testing import CliRunner

    from raggedvit.cli import main

    real = md.version
    monkeypatch.setattr(md, "version", lambda dist: "9.0.0" if dist == "timm" else real(dist))
    res = CliRunner().invoke(main, ["info"])
    assert res.exit_code == 0, res.output
    assert "warning: timm 9.0.0 is outside the supported range timm>=1.0.15,<1.1" in res.output


def test_module_exits_nonzero_outside_the_range():
    res = subprocess.run([sys.executable, "-m", "raggedvit._versions"], capture_output=True, text=True,
                         cwd=_ROOT, timeout=60)  # fmt: skip
    assert res.returncode == (1 if check_versions() else 0), res.stderr
