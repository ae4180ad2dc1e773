"""Fixtures of the op-library tests: the built library (built once if missing) and fresh random seeds."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _ort_models, _ort_library
from _ort_library import ensure_library  # noqa: E402


@pytest.fixture(scope="session")
def ort_library() -> str:
    """Path of libraggedvit_ort.so (built once if missing)."""
    return ensure_library()


@pytest.fixture
def gen(request: pytest.FixtureRequest) -> Iterator[torch.Generator]:
    """A generator with a fresh seed per test (printed, so a failure can be replayed with RAGGEDVIT_SEED)."""
    seed = int(os.environ.get("RAGGEDVIT_SEED", int.from_bytes(os.urandom(4), "little")))
    print(f"seed={seed} (replay: RAGGEDVIT_SEED={seed})")
    request.node.user_properties.append(("seed", seed))
    yield torch.Generator().manual_seed(seed)
