"""The wheel's platform tag, read from the built libraggedvit_ort.so (used by setup.py's bdist_wheel).

The library is no Python extension (no libpython, no CPython ABI), so the wheel is `py3-none-<platform>`.
The platform is `manylinux_2_N_<arch>` when the library needs only the libraries every manylinux system has
and symbol versions that the manylinux_2_N reference distribution ships; otherwise the plain `linux_<arch>`
(installable where it was built, not uploadable to PyPI). `auditwheel show` gives the same answer; CI checks.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ElfNeeds", "elf_needs", "manylinux_platform", "wheel_platform"]

# the libraries a manylinux system provides (PEP 599/600), plus the dynamic loader itself
_SYSTEM_LIBS = frozenset(
    {
        "libc.so.6",
        "libm.so.6",
        "libdl.so.2",
        "librt.so.1",
        "libpthread.so.0",
        "libgcc_s.so.1",
        "libstdc++.so.6",
        "ld-linux-x86-64.so.2",
        "ld-linux-aarch64.so.1",
    }
)
# (glibc minor, newest GLIBCXX_3.4.x patch) of the manylinux reference distributions, oldest first:
# CentOS 7, Debian 9, Ubuntu 18.04, AlmaLinux 8, Ubuntu 20.04, AlmaLinux 9, Ubuntu 22.04, Debian 12, Ubuntu 24.04
_LEVELS = ((17, 19), (24, 22), (27, 24), (28, 24), (31, 28), (34, 29), (35, 30), (36, 30), (39, 33))
_OLDEST_CXXABI = (1, 3, 7)  # CXXABI_1.3.7 is the newest that manylinux_2_17 allows


@dataclass(frozen=True)
class ElfNeeds:
    """What a shared library asks of the system: NEEDED libraries and versioned symbol sets (GLIBC_2.34 ...)."""

    libraries: frozenset[str]
    versions: frozenset[str]

    def newest(self, prefix: str) -> tuple[int, ...]:
        """Newest version with `prefix` (e.g. "GLIBC_" -> (2, 34)); () if none."""
        found = [tuple(int(x) for x in v[len(prefix) :].split(".")) for v in self.versions if _is_version(v, prefix)]
        return max(found, default=())


def _is_version(name: str, prefix: str) -> bool:
    return name.startswith(prefix) and re.fullmatch(r"\d+(\.\d+)*", name[len(prefix) :]) is not None


def elf_needs(path: str | Path) -> ElfNeeds:
    """NEEDED entries (.dynamic) and version needs (.gnu.version_r) of a 64-bit little-endian ELF file."""
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path}: not a 64-bit little-endian ELF file")
    shoff, shentsize, shnum = struct.unpack_from("<Q", data, 0x28)[0], *struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]

    def string(table: int, offset: int) -> str:
        start = sections[table][4] + offset
        return data[start : data.index(b"\0", start)].decode()

    libraries: set[str] = set()
    versions: set[str] = set()
    for _, sh_type, _, _, offset, size, link, info, _, _ in sections:
        if sh_type == 6:  # SHT_DYNAMIC: Elf64_Dyn {d_tag, d_val}
            for pos in range(offset, offset + size, 16):
                tag, val = struct.unpack_from("<qQ", data, pos)
                if tag == 1:  # DT_NEEDED
                    libraries.add(string(link, val))
        elif sh_type == 0x6FFFFFFE:  # SHT_GNU_verneed: `info` Elf64_Verneed entries, each with Elf64_Vernaux
            pos = offset
            for _ in range(info):
                _, count, _, aux, next_need = struct.unpack_from("<HHIII", data, pos)
                apos = pos + aux
                for _ in range(count):
                    _, _, _, name, next_aux = struct.unpack_from("<IHHII", data, apos)
                    versions.add(string(link, name))
                    apos += next_aux
                pos += next_need
    return ElfNeeds(frozenset(libraries), frozenset(versions))


def manylinux_platform(needs: ElfNeeds, arch: str) -> str | None:
    """The oldest `manylinux_2_N_<arch>` that satisfies `needs`; None if none does."""
    if arch not in ("x86_64", "aarch64") or not needs.libraries <= _SYSTEM_LIBS:
        return None
    glibc, glibcxx, cxxabi = needs.newest("GLIBC_"), needs.newest("GLIBCXX_"), needs.newest("CXXABI_")
    if glibc[:1] not in ((), (2,)) or glibcxx[:2] not in ((), (3, 4)):
        return None
    for minor, cxx_patch in _LEVELS:
        fits_glibc = glibc[1:2] <= (minor,)
        fits_cxx = glibcxx[2:3] <= (cxx_patch,) and (minor > 17 or cxxabi <= _OLDEST_CXXABI)
        if fits_glibc and fits_cxx:
            return f"manylinux_2_{minor}_{arch}"
    return None


def wheel_platform(library: str | Path, default: str) -> str:
    """The platform tag for a wheel carrying `library`: manylinux when it qualifies, else `default`
    (bdist_wheel's own, e.g. linux_x86_64). A non-Linux `default` is returned unchanged."""
    if not default.startswith("linux_"):
        return default
    try:
        needs = elf_needs(library)
    except (OSError, ValueError, struct.error):
        return default
    return manylinux_platform(needs, default[len("linux_") :]) or default
