"""Fixtures of the kernel tests: the interpreted Triton kernels; fresh random seeds: tests/conftest.py."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _kernel_cases


@pytest.fixture(scope="session")
def interpreted() -> ModuleType:
    """The Triton kernels decorated under TRITON_INTERPRET=1 (they run on CPU tensors)."""
    from raggedvit.kernels._launch import load_interpreted_kernels

    return load_interpreted_kernels()
