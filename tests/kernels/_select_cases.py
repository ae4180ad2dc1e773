"""Run under TRITON_INTERPRET=1 by test_select_kernel.py: the selection kernels on every SELECT_CASES case, by both
paths (the launch's sorted path, and the pairwise path that a sort width below the case's width forces), printed
as JSON {path: {case: {output: equal to select_rows_reference}}}."""

from __future__ import annotations

import json
import sys

import torch

PATHS = {"sorted": None, "pairwise": (8, 4)}  # launch_select's config: the default, or WP 8 (< every case's width)


def _run_interpreted() -> dict[str, dict[str, dict[str, bool]]]:
    from raggedvit.kernels import _select_kernel
    from raggedvit.kernels._select_launch import launch_select
    from raggedvit.pruning.select import SelectedRows, select_rows_reference
    from tests.support.select_cases import SELECT_CASES, make_select_inputs

    out: dict[str, dict[str, dict[str, bool]]] = {path: {} for path in PATHS}
    for case in SELECT_CASES:
        scores, cu, bound = make_select_inputs(case)
        args = (scores, cu, case.width, bound, case.num_prefix, case.policy, case.keep, case.mass)
        ref = select_rows_reference(*args)
        for path, config in PATHS.items():
            got = launch_select(*args, kernels=_select_kernel, config=config)
            out[path][case.name] = {f: bool(torch.equal(g, r)) for f, g, r in zip(SelectedRows._fields, got, ref)}
    return out


if __name__ == "__main__":
    json.dump(_run_interpreted(), sys.stdout)
