"""Fixtures of the kernel tests: fresh random seeds and the interpreted Triton kernels."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _kernel_cases


@pytest.fixture
def gen(request: pytest.FixtureRequest) -> Iterator[torch.Generator]:
    """A generator with a fresh seed per test (printed, so a failure can be replayed with RAGGEDVIT_SEED)."""
    seed = int(os.environ.get("RAGGEDVIT_SEED", int.from_bytes(os.urandom(4), "little")))
    print(f"seed={seed} (replay: RAGGEDVIT_SEED={seed})")
    request.node.user_properties.append(("seed", seed))
    yield torch.Generator().manual_seed(seed)


@pytest.fixture(scope="session")
def interpreted() -> ModuleType:
    """The Triton kernels decorated under TRITON_INTERPRET=1 (they run on CPU tensors)."""
    from raggedvit.kernels._launch import load_interpreted_kernels

    return load_interpreted_kernels()
