"""Fixtures of the op-library tests: the built library (built once if missing); seeds: tests/conftest.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _ort_library
from _ort_library import ensure_library  # noqa: E402


@pytest.fixture(scope="session")
def ort_library() -> str:
    """Path of libraggedvit_ort.so (built once if missing)."""
    return ensure_library()
