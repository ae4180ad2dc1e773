"""The merge kernel (`_merge_kernel._ragged_merge` through `_merge_launch.launch_merge`) in the Triton interpreter
against `merge_tokens_reference`: exact cu / src / sizes, x within float32 rounding (1e-6) or one ulp of float16,
key_bias and score within 1e-6, the same bits on a second launch. The cases (tests/support/merge_kernel_cases.py) cover
p = 0, 1, 2, 5, with and without a class token, bias and sizes, r = 0 / small / clamped / past one chunk of merged
rows, B = 1, 2, 3, ties, NaN keys, no B row, p = n, the fused attention residual (skip, skip bias), and (slow) the
tiled wide images n = 577 and 1025 and the widest variant. On a GPU: tests/custom_ops/test_ragged_merge_cuda.py."""

from __future__ import annotations

import pytest
from _interpreted import run_cases_interpreted

from tests.support.merge_kernel_cases import MERGE_CASES, MERGE_SLOW_CASES

# one pytest-xdist worker runs this module (`--dist loadgroup`), so its module fixtures run once
pytestmark = pytest.mark.xdist_group("test_merge_kernel")

_CHECKS = ("cu", "src", "shapes", "x", "size", "key_bias", "score", "margins", "deterministic")


@pytest.fixture(scope="module")
def interpreted() -> dict[str, dict[str, bool]]:
    """_merge_cases.py fast in a process started with TRITON_INTERPRET=1 (set before triton's import)."""
    return run_cases_interpreted("_merge_cases.py")


@pytest.fixture(scope="module")
def interpreted_slow() -> dict[str, dict[str, bool]]:
    return run_cases_interpreted("_merge_cases.py", "slow")


@pytest.mark.parametrize("case", MERGE_CASES, ids=lambda c: c.name)
def test_kernel_in_interpreter_equals_reference(interpreted, case):
    assert interpreted[case.name] == dict.fromkeys(_CHECKS, True)


@pytest.mark.slow
@pytest.mark.parametrize("case", MERGE_SLOW_CASES, ids=lambda c: c.name)
def test_wide_images_in_interpreter_equal_reference(interpreted_slow, case):
    assert interpreted_slow[case.name] == dict.fromkeys(_CHECKS, True)
