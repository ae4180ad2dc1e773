"""Fixtures of the pruning tests."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _pruning_models


@pytest.fixture
def no_grad() -> Iterator[None]:
    with torch.no_grad():
        yield
