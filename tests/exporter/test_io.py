"""atomic_write: whole file or nothing, with the permissions of a plain open()."""

from __future__ import annotations

import os

import pytest

from raggedvit.exporter._io import atomic_write, atomic_write_all, staging_dir


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


def test_atomic_write_all_is_all_or_nothing(tmp_path):
    """The second rename fails (its target is a non-empty folder): the first file is not left either."""
    (tmp_path / "rep.md").mkdir()
    (tmp_path / "rep.md" / "x").write_text("")
    with pytest.raises(OSError):
        atomic_write_all({tmp_path / "rep.json": "{}", tmp_path / "rep.md": "# r"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep.md"]
    assert atomic_write_all({tmp_path / "a.json": "1", tmp_path / "a.md": "2"})
    assert (tmp_path / "a.json").read_text() == "1" and (tmp_path / "a.md").read_text() == "2"


def test_staging_dir_is_removed_on_any_exit(tmp_path):
    with pytest.raises(KeyboardInterrupt), staging_dir(tmp_path, "m.onnx") as tmp:
        (tmp / "part").write_bytes(b"x")
        assert tmp.parent == tmp_path and tmp.name.startswith(".m.onnx.")
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []
