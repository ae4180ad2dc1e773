"""Run under TRITON_INTERPRET=1 by test_merge_kernel.py: the merge kernel (`launch_merge`) on MERGE_CASES (argument
"fast") or MERGE_SLOW_CASES ("slow") against `merge_tokens_reference`, printed as JSON {case: {check: bool}}: each
output within its tolerance (`compare_merge`), "margins" (the planted cases' decisions are clear of float32
rounding, so the comparison is exact), and "deterministic" (a second launch gives the same bits)."""

from __future__ import annotations

import json
import sys

import torch


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.is_floating_point() else t  # NaN and -0 compare by their bits


def _run_interpreted(which: str) -> dict[str, dict[str, bool]]:
    from raggedvit.kernels import _merge_kernel
    from raggedvit.kernels._merge_launch import launch_merge
    from raggedvit.pruning.merge import merge_tokens_reference
    from tests.support.merge_kernel_cases import (
        MARGIN,
        MERGE_CASES,
        MERGE_SLOW_CASES,
        compare_merge,
        decision_margins,
        make_merge_inputs,
        make_skip_inputs,
    )

    out: dict[str, dict[str, bool]] = {}
    for case in MERGE_CASES if which == "fast" else MERGE_SLOW_CASES:
        x, qkv, bias, size, cu = make_merge_inputs(case)
        args = (x, qkv, bias, size, cu, case.H, case.p, case.r, case.class_token)
        skip = make_skip_inputs(case)
        ref = merge_tokens_reference(*args, **skip)
        got = launch_merge(*args, **skip, kernels=_merge_kernel, config=case.config)
        res = compare_merge(got, ref, case.dtype, case.size)
        margins = decision_margins(qkv, bias, case.B, case.n, case.H, case.p, case.r, case.class_token)
        res["margins"] = case.ties or bool((margins > MARGIN).all())
        again = launch_merge(*args, **skip, kernels=_merge_kernel, config=case.config)
        res["deterministic"] = all(torch.equal(_bits(a), _bits(b)) for a, b in zip(got, again))
        out[case.name] = res
    return out


if __name__ == "__main__":
    json.dump(_run_interpreted(sys.argv[1] if len(sys.argv) > 1 else "fast"), sys.stdout)
