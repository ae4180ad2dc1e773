"""Build hook: compiles the ONNX Runtime op library (Triton AOT cubins + C++) during install.

All metadata lives in pyproject.toml. The library is not a Python module; it is
built by raggedvit/custom_ops/build.py into raggedvit/custom_ops/libraggedvit_ort.so.
Set RAGGEDVIT_SKIP_OPS=1 to install without it (the ORT features then fail with a clear error).

`pip wheel --no-build-isolation --no-deps .` makes a wheel that carries the library: tagged
py3-none-<platform> (it has no CPython ABI), where the platform is manylinux_2_N when the library
qualifies (raggedvit/custom_ops/_platform_tag.py), else linux_<arch>. Installing it compiles nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_ext import build_ext

LIB_NAME = "libraggedvit_ort.so"
EXT_NAME = "raggedvit.custom_ops._ortlib"


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


class PlatformWheel(bdist_wheel):
    """A wheel tagged py3-none-<platform>: any Python 3, the platform the op library was built for."""

    def get_tag(self) -> tuple[str, str, str]:
        python, abi, plat = super().get_tag()
        if self.root_is_pure:  # RAGGEDVIT_SKIP_OPS=1: no library, a py3-none-any wheel
            return python, abi, plat
        sys.path.insert(0, str(Path(__file__).resolve().parent))  # as build.py does: no install needed
        from raggedvit.custom_ops._platform_tag import wheel_platform

        library = self.get_finalized_command("build_ext").get_ext_fullpath(EXT_NAME)
        return "py3", "none", wheel_platform(library, plat)


SKIP_OPS = os.environ.get("RAGGEDVIT_SKIP_OPS") == "1"
if SKIP_OPS:
    print("RAGGEDVIT_SKIP_OPS=1: not building the ONNX Runtime op library")

setup(
    ext_modules=[] if SKIP_OPS else [Extension(EXT_NAME, sources=[])],
    cmdclass={"build_ext": BuildOrtOps, "bdist_wheel": PlatformWheel},
)
