"""Build hook: compiles the ONNX Runtime op library (Triton AOT cubins + C++) during install.

All metadata lives in pyproject.toml. The library is not a Python module; it is
built by raggedvit/custom_ops/build.py into raggedvit/custom_ops/libraggedvit_ort.so.
Set RAGGEDVIT_SKIP_OPS=1 to install without it (the ORT features then fail with a clear error).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

LIB_NAME = "libraggedvit_ort.so"


class BuildOrtOps(build_ext):
    def get_ext_filename(self, fullname: str) -> str:
        return os.path.join(*fullname.split(".")[:-1], LIB_NAME)

    def build_extension(self, ext: Extension) -> None:
        target = Path(self.get_ext_fullpath(ext.name)).resolve()
        target.parent.mkdir(parents=True, exist_ok=True)
        root = Path(__file__).resolve().parent
        cmd = [sys.executable, str(root / "raggedvit" / "custom_ops" / "build.py"), "--output", str(target)]
        print("building the ORT op library:", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, cwd=root)


SKIP_OPS = os.environ.get("RAGGEDVIT_SKIP_OPS") == "1"
if SKIP_OPS:
    print("RAGGEDVIT_SKIP_OPS=1: not building the ONNX Runtime op library")

setup(
    ext_modules=[] if SKIP_OPS else [Extension("raggedvit.custom_ops._ortlib", sources=[])],
    cmdclass={"build_ext": BuildOrtOps},
)
