"""CPU tests of benchmarks.block_engine's bookkeeping: layouts, rooflines, the gate, the file name, the table."""

from __future__ import annotations

import pytest

from benchmarks.block_engine import (
    HBM_BYTES_PER_S,
    TENSOR_FLOPS,
    block_roofline_us,
    gate,
    phase_costs,
    result_name,
    seq_lengths,
    table,
)


def test_seq_lengths() -> None:
    assert seq_lengths(197, 1) == [197]
    assert seq_lengths(788, 4) == [197] * 4
    assert seq_lengths(10, 4) == [3, 3, 2, 2]


def test_phase_costs_deit_base_b1() -> None:
    costs = {c["phase"]: c for c in phase_costs(768, 12, 3072, [197])}
    assert list(costs) == ["norm1", "qkv", "attn", "proj", "norm2", "fc1", "fc2"]
    assert costs["norm1"]["weight_bytes"] == 0 and costs["norm1"]["act_bytes"] == 2 * 2 * 197 * 768
    weights = sum(c["weight_bytes"] for c in costs.values())
    assert weights == 2 * (3 + 1 + 4 + 4) * 768 * 768  # 14.2 MB of fp16 weights per block
    assert costs["qkv"]["flops"] == 2 * 197 * 768 * 2304
    assert costs["attn"]["flops"] == 4 * 197 * 197 * 768 and costs["attn"]["weight_bytes"] == 0
    fc2 = costs["fc2"]
    fc2_bytes_s = (fc2["weight_bytes"] + fc2["act_bytes"]) / HBM_BYTES_PER_S
    assert fc2["roofline_us"] == pytest.approx(max(fc2["flops"] / TENSOR_FLOPS, fc2_bytes_s) * 1e6)
    # the block's floor is about 3 us of weight reads or the FLOPs, whichever is larger
    floor = block_roofline_us(list(costs.values()))
    assert 3.0 < floor < 5.0


def test_phase_costs_follow_the_rows() -> None:
    full = phase_costs(384, 6, 1536, [197] * 4)
    half = phase_costs(384, 6, 1536, [99] * 4)
    assert all(f["weight_bytes"] == h["weight_bytes"] for f, h in zip(full, half))
    assert all(h["flops"] < f["flops"] for f, h in zip(full, half))


def _rec(T: int, engine: float, cublas: float, ragged: float, model: str = "deit_base") -> dict:
    return {"model": model, "T": T, "B": 1, "engine_us": engine, "per_op_cublas_us": cublas,
            "per_op_ragged_us": ragged, "phases": phase_costs(768, 12, 3072, [T])}  # fmt: skip


def test_gate_takes_the_faster_per_op_block_and_the_worst_case() -> None:
    passed = gate([_rec(197, 10.0, 35.0, 30.0), _rec(99, 8.0, 33.0, 20.0)])
    assert passed["passed"] and passed["speedups"] == {"197": 3.0, "99": 2.5}
    failed = gate([_rec(197, 10.0, 35.0, 30.0), _rec(99, 12.0, 33.0, 20.0)])
    assert not failed["passed"] and "1.67x < 2.0x" in failed["reason"]
    swept = [_rec(197, 10.0, 35.0, 30.0), _rec(99, 12.0, 33.0, 20.0)]
    swept[0]["sweep"] = [{"us": 12.0, "rel_err": 4e-4}]
    swept[1]["sweep"] = [{"us": 9.0, "rel_err": 4e-4}, {"us": 5.0, "rel_err": 0.5}, {"error": "x"}]  # wrong: skipped
    best = gate(swept, best=True)
    assert best["passed"] and best["speedups"]["99"] == pytest.approx(20.0 / 9.0)
    missing = gate([_rec(197, 10.0, 35.0, 30.0), _rec(99, 1.0, 33.0, 20.0, model="deit_small")])
    assert not missing["passed"] and "missing" in missing["reason"]


def test_result_name_and_table() -> None:
    assert result_name("NVIDIA H200") == "block_engine_NVIDIA-H200.json"
    rec = _rec(197, 10.0, 35.0, 30.0)
    rec["phases"][1]["alone_us"] = 4.5
    lines = table([rec])
    assert "3.00" in lines[1] and "deit_base" in lines[1]
    assert "4.50/0.99" in lines[-1]


def test_sweep_configs_are_engine_config_fields() -> None:
    import dataclasses

    import torch

    from benchmarks.block_engine import sweep_configs
    from raggedvit.kernels.block_engine import engine_config

    base = engine_config(torch.float16)
    assert sweep_configs()[0] == {}
    for over in sweep_configs():
        dataclasses.replace(base, **over)  # every override names a field
