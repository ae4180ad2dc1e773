"""The block engine (raggedvit.kernels.block_engine) against vit_block_reference: the whole block and each phase
alone (the tile functions), run by Triton's interpreter in sequential mode (tests/kernels/_block_cases.py); the
argument checks in process."""

from __future__ import annotations

import os

import pytest
import torch
from _interpreted import _HERE, _ROOT

from raggedvit.kernels.block_engine import vit_block_engine
from raggedvit.kernels.reference import BlockWeights


def test_block_engine_interpreted(gen: torch.Generator) -> None:
    import json
    import subprocess
    import sys

    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(_ROOT)}
    proc = subprocess.run([sys.executable, str(_HERE / "_block_cases.py"), str(seed)], env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    failed = {name: err for name, err in json.loads(proc.stdout).items() if err is not None}
    assert not failed, failed


def _weights(C: int = 8, F: int = 16) -> BlockWeights:
    def z(*shape: int) -> torch.Tensor:
        return torch.zeros(*shape)

    return BlockWeights(z(C), z(C), z(3 * C, C), z(3 * C), z(C, C), z(C), z(C), z(C), z(F, C), z(F), z(C, F), z(C))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"x": torch.zeros(4, 8, 1)}, "x must be 2-D [T, C]"),
        ({"cu": torch.zeros(2, dtype=torch.float32)}, "cu_seqlens dtype must be int32 or int64"),
        ({"heads": 3}, "num_heads must divide C = 8"),
        ({"w": {"qkv_weight": torch.zeros(8, 8)}}, "qkv_weight must be [24, 8]"),
        ({"w": {"fc2_weight": torch.zeros(8, 15)}}, "fc2_weight must be [8, 16]"),
        ({"w": {"norm2_bias": None}}, "norm2_bias is required"),
        ({"w": {"proj_bias": torch.zeros(8, dtype=torch.float16)}}, "qkv_weight's dtype (the GEMM dtype)"),
        ({"w": {"fc1_weight": torch.zeros(8, 16).t()}}, "w.fc1_weight (16, 8) must be contiguous"),
    ],
)
def test_block_engine_checks_name_the_argument(change: dict, message: str) -> None:
    w = _weights()
    w = w._replace(**change.get("w", {}))
    x = change.get("x", torch.zeros(5, 8))
    cu = change.get("cu", torch.tensor([0, 5]))
    with pytest.raises(ValueError) as info:
        vit_block_engine(x, cu, w, change.get("heads", 2))
    assert message in str(info.value)


def test_block_engine_cpu_needs_the_interpreter() -> None:
    if os.environ.get("TRITON_INTERPRET"):
        pytest.skip("the process runs Triton's interpreter")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        vit_block_engine(torch.zeros(5, 8), torch.tensor([0, 5]), _weights(), 2)
