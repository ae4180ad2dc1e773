"""atomic_write: whole file or nothing, with the permissions of a plain open()."""

from __future__ import annotations

import os

import pytest

from raggedvit.exporter._io import atomic_write


def test_atomic_write_content_and_mode(tmp_path):
    old = os.umask(0o022)
    try:
        path = atomic_write(tmp_path / "r.json", "{}\n")
    finally:
        os.umask(old)
    assert path.read_text() == "{}\n"
    assert path.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_atomic_write_leaves_nothing_on_failure(tmp_path):
    with pytest.raises(TypeError):
        atomic_write(tmp_path / "x.bin", object())  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []
