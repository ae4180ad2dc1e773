"""The wheel's platform tag from the built library's ELF needs (setup.py's bdist_wheel)."""

from __future__ import annotations

import os
import platform
import sys

import pytest

from raggedvit.custom_ops._platform_tag import ElfNeeds, elf_needs, manylinux_platform, wheel_platform

BASE = {"libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1", "ld-linux-x86-64.so.2"}


def needs(*versions: str, libraries: set[str] = BASE) -> ElfNeeds:
    return ElfNeeds(frozenset(libraries), frozenset(versions))


@pytest.mark.parametrize(
    "versions,expected",
    [
        (("GLIBC_2.2.5", "GLIBC_2.14", "GLIBCXX_3.4.19", "CXXABI_1.3.7"), "manylinux_2_17_x86_64"),
        (("GLIBC_2.14", "CXXABI_1.3.9"), "manylinux_2_24_x86_64"),  # newer C++ ABI than CentOS 7's
        (("GLIBC_2.27", "GLIBCXX_3.4.25"), "manylinux_2_31_x86_64"),  # libstdc++ newer than glibc asks
        (("GLIBC_2.34", "GLIBCXX_3.4.29", "CXXABI_1.3.9", "GCC_3.0", "GLIBC_PRIVATE"), "manylinux_2_34_x86_64"),
        (("GLIBC_2.39", "GLIBCXX_3.4.33"), "manylinux_2_39_x86_64"),
        (("GLIBC_2.40",), None),  # newer than any level known here
        (("GLIBC_2.17", "GLIBCXX_3.4.34"), None),
    ],
)
def test_manylinux_levels(versions, expected):
    assert manylinux_platform(needs(*versions), "x86_64") == expected


def test_other_libraries_or_arches_are_plain_linux():
    assert manylinux_platform(needs("GLIBC_2.17", libraries=BASE | {"libonnxruntime.so.1"}), "x86_64") is None
    assert manylinux_platform(needs("GLIBC_2.17"), "ppc64le") is None
    assert wheel_platform(__file__, "linux_x86_64") == "linux_x86_64"  # not an ELF file: the default
    assert wheel_platform(__file__, "macosx_11_0_arm64") == "macosx_11_0_arm64"


def test_built_library(ort_library):
    """The library needs only system libraries (no ORT, no CUDA: both are opened at run time), and its tag is one
    that pip accepts on this machine."""
    lib_needs = elf_needs(ort_library)
    assert lib_needs.libraries <= {*BASE, "libdl.so.2", "libpthread.so.0", "librt.so.1", "ld-linux-aarch64.so.1"}
    assert not any(lib.startswith(("libonnxruntime", "libcuda", "libcudart")) for lib in lib_needs.libraries)
    if sys.platform != "linux" or platform.machine() != "x86_64":
        pytest.skip("tag check written for linux x86_64")
    tag = wheel_platform(ort_library, "linux_x86_64")
    assert tag.startswith("manylinux_2_") and tag.endswith("_x86_64"), tag
    glibc = tuple(int(x) for x in os.confstr("CS_GNU_LIBC_VERSION").split()[1].split(".")[:2])
    assert int(tag.split("_")[2]) <= glibc[1], (tag, glibc)
