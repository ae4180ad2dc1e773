"""Atomic file writes: a temp file in the target folder, then os.replace (no partial output on failure)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["atomic_write", "open_file_mode"]


def atomic_write(path: str | Path, data: bytes | str) -> Path:
    """Write `data` (str as UTF-8) to `path` atomically; the folder must exist. Returns the path.

    The file gets the permissions a plain open() would give it (0666 minus the umask), not mkstemp's 0600."""
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, open_file_mode())
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def open_file_mode() -> int:
    """The permissions a plain open() gives a new file: 0666 minus the umask (temp files start at 0600)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask
