"""Which ONNX Runtime is installed: `info`'s report, the two-distributions warning, one clear error without one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from raggedvit.cli import ort_dist

ROOT = Path(__file__).resolve().parents[2]


def test_installed_and_owner():
    import onnxruntime

    dists = ort_dist.installed()
    assert dists, "the tests need an ONNX Runtime distribution"
    owner = ort_dist.module_owner()
    assert owner in dists and dists[owner] == onnxruntime.__version__
    status = ort_dist.status()
    assert status.version == onnxruntime.__version__ and "CPUExecutionProvider" in status.providers
    assert status.describe().startswith(f"{onnxruntime.__version__} ({owner}")


def test_conflict_warning():
    assert ort_dist.conflict({"onnxruntime": "1.32.0"}) is None
    both = ort_dist.conflict({"onnxruntime": "1.30.0", "onnxruntime-gpu": "1.31.1"})
    assert "onnxruntime 1.30.0 and onnxruntime-gpu 1.31.1 are installed" in both
    assert "pip uninstall -y onnxruntime onnxruntime-gpu" in both


def test_status_describes_both():
    status = ort_dist.RuntimeStatus(
        {"onnxruntime": "1.30.0", "onnxruntime-gpu": "1.31.1"}, "onnxruntime-gpu", "1.31.1", [], None, "w"
    )
    assert status.describe() == "1.31.1 (onnxruntime-gpu; also installed: onnxruntime 1.30.0)"


def test_missing_runtime(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` raises ImportError
    monkeypatch.setattr(ort_dist, "installed", lambda: {})
    with pytest.raises(
        ort_dist.OnnxRuntimeMissing, match=r"not installed; install one: pip install 'raggedvit\[cpu\]'"
    ):
        ort_dist.require_onnxruntime()
    status = ort_dist.status()
    assert status.version is None and status.describe().startswith("ONNX Runtime is not installed")
    monkeypatch.setattr(ort_dist, "installed", lambda: {"onnxruntime-gpu": "1.31.1"})
    with pytest.raises(ort_dist.OnnxRuntimeMissing, match="onnxruntime-gpu 1.31.1 installed, but `import onnxruntime`"):
        ort_dist.require_onnxruntime()


@pytest.fixture
def no_onnxruntime(tmp_path) -> dict[str, str]:
    """Environment whose `import onnxruntime` fails as if no runtime were installed (a shadowing package)."""
    fake = tmp_path / "shadow" / "onnxruntime"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'onnxruntime'\", name='onnxruntime')\n"
    )
    path = os.pathsep.join([str(tmp_path / "shadow"), str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


@pytest.mark.parametrize("command", [["validate", "m.onnx", "--random", "1"], ["bench", "m.onnx"]])
def test_cli_without_runtime_is_one_error(no_onnxruntime, command):
    res = subprocess.run(
        [sys.executable, "-m", "raggedvit", *command], env=no_onnxruntime, capture_output=True, text=True, cwd=ROOT
    )
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert lines[0].startswith("error: ") and "import onnxruntime" in lines[0] and "reinstall" in lines[0]


def test_info_without_runtime(no_onnxruntime):
    res = subprocess.run(
        [sys.executable, "-m", "raggedvit", "info"], env=no_onnxruntime, capture_output=True, text=True, cwd=ROOT
    )
    assert res.returncode == 0, res.stderr
    line = next(x for x in res.stdout.splitlines() if x.startswith("onnxruntime"))
    assert "import onnxruntime` fails" in line and "ORT providers" not in res.stdout


def test_info_warns_when_both_are_installed(tmp_path):
    """A second distribution's metadata on the path (as an onnxruntime-gpu unpacked beside the CPU one)."""
    import onnxruntime

    meta = tmp_path / "onnxruntime_gpu-9.9.9.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: onnxruntime-gpu\nVersion: 9.9.9\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, "-m", "raggedvit", "info"], env=env, capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert "and onnxruntime-gpu 9.9.9 are installed" in res.stderr and "the one installed last wins" in res.stderr
    line = next(x for x in res.stdout.splitlines() if x.startswith("onnxruntime"))
    assert line.split(None, 1)[1] == f"{onnxruntime.__version__} (onnxruntime; also installed: onnxruntime-gpu 9.9.9)"
