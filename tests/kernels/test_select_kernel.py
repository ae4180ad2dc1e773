"""The selection kernels (`_select_kernel.py`) in the Triton interpreter against the torch op's CPU math
(select_rows_reference), and on a GPU through the JIT (`torch.ops.raggedvit.select_rows` on CUDA tensors)."""

from __future__ import annotations

import pytest
import torch
from _interpreted import run_cases_interpreted

from raggedvit.pruning.select import SelectedRows, select_rows_reference
from tests.support.select_cases import SELECT_CASES, make_select_inputs

# one pytest-xdist worker runs this module (`--dist loadgroup`), so its module fixtures run once
pytestmark = pytest.mark.xdist_group("test_select_kernel")


@pytest.fixture(scope="module")
def interpreted() -> dict[str, dict[str, dict[str, bool]]]:
    """_select_cases.py in a process started with TRITON_INTERPRET=1 (set before triton's import)."""
    return run_cases_interpreted("_select_cases.py")


@pytest.mark.parametrize("path", ["sorted", "pairwise"])
@pytest.mark.parametrize("case", SELECT_CASES, ids=lambda c: c.name)
def test_kernels_in_interpreter_equal_cpu_op(interpreted, case, path):
    # the cases' mass sums are exact enough that the float order of the sums does not change k
    assert interpreted[path][case.name] == dict.fromkeys(SelectedRows._fields, True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", SELECT_CASES, ids=lambda c: c.name)
def test_jit_kernels_equal_cpu_op(case):
    scores, cu, bound = make_select_inputs(case)
    args = (case.width, bound, case.num_prefix, case.policy, case.keep, case.mass)
    got = torch.ops.raggedvit.select_rows(scores.cuda(), cu.cuda(), *args)
    ref = select_rows_reference(scores, cu, *args)
    for name, g, r in zip(SelectedRows._fields, got, ref):
        assert torch.equal(g.cpu(), r), name
