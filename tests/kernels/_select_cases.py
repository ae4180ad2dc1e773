"""Run under TRITON_INTERPRET=1 by test_select_kernel.py: the selection kernels on every SELECT_CASES case, printed
as JSON {case: {output: equal to select_rows_reference}}."""

from __future__ import annotations

import json
import sys

import torch


def _run_interpreted() -> dict[str, dict[str, bool]]:
    from raggedvit.kernels import _select_kernel
    from raggedvit.kernels._select_launch import launch_select
    from raggedvit.pruning._select_cases import SELECT_CASES, make_select_inputs
    from raggedvit.pruning.select import SelectedRows, select_rows_reference

    out = {}
    for case in SELECT_CASES:
        scores, cu, bound = make_select_inputs(case)
        args = (scores, cu, case.width, bound, case.num_prefix, case.policy, case.keep, case.mass)
        got = launch_select(*args, kernels=_select_kernel)
        ref = select_rows_reference(*args)
        out[case.name] = {f: bool(torch.equal(g, r)) for f, g, r in zip(SelectedRows._fields, got, ref)}
    return out


if __name__ == "__main__":
    json.dump(_run_interpreted(), sys.stdout)
