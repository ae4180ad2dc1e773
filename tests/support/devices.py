"""Run a GPU test's body on the CPU so that a tensor made on the wrong device fails there too."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

__all__ = ["DEVICES", "strict_device"]

# a GPU test body parametrized over these runs in CPU CI as "cpu" and on a GPU as "cuda"
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")],
    ),
]


@contextlib.contextmanager
def strict_device(device: str | torch.device) -> Iterator[None]:
    """On the CPU, makes "meta" the default device for the block, so that a factory call without device=
    (torch.ones(n), torch.arange(n)) builds a meta tensor, and the first op that mixes it with the CPU inputs
    raises, as a CPU tensor mixed with CUDA ones does on a GPU. On another device, nothing changes."""
    if torch.device(device).type != "cpu":
        yield
        return
    with torch.device("meta"):
        yield
