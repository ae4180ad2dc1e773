"""RaggedAttention's relative position bias (inputs pos_table, token_pos; attributes grid_h, grid_w, num_prefix) on
ORT's CPU EP vs the float64 reference, and every bad combination refused with a status naming argument and shapes."""

from __future__ import annotations

import pytest
import torch
from _relpos_cases import check, pos_model, relpos_inputs, run_pos
from onnx import TensorProto

from raggedvit.kernels.reference import pos_table_size, ragged_attention_reference
from raggedvit.runtime import create_session, run_with_iobinding
from tests.support.ort_models import DTYPES, attention_model, random_batch
from tests.support.testing import assert_close

DTYPES_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("cu_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("with_cls", [True, False])
def test_cpu_ep_matches_reference(ort_library, gen, dtype, cu_dtype, with_cls):
    H, D = 3, 16
    qkv, cu = random_batch(gen, 6, 40, H, D, dtype, cu_dtype)
    lengths = (cu[1:] - cu[:-1]).tolist()
    pos = relpos_inputs(lengths, H, (4, 5), 1, gen, cu_dtype=cu_dtype, odd_rows=4)
    got = run_pos("cpu", pos_model(dtype, cu_dtype, H, pos, cls_attn=with_cls), qkv, cu, pos, cls_attn=with_cls)
    check(got, qkv, cu, H, pos, rtol=DTYPES_TOL[dtype])


@pytest.mark.parametrize(("grid", "p"), [((1, 1), 0), ((3, 7), 2), ((14, 14), 1)])
def test_cpu_ep_grids_prefixes_and_bias(ort_library, gen, grid, p):
    H, D = 2, 8
    lengths = [p + grid[0] * grid[1], 5, 1, 0, 30]
    qkv, cu = random_batch(gen, 1, 1, H, D, torch.float32, torch.int64)  # replaced below
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    qkv = torch.randn(int(cu[-1]), 3 * H * D, generator=gen)
    bias = torch.randn(3 * H * D, generator=gen)
    pos = relpos_inputs(lengths, H, grid, p, gen, cu_dtype=torch.int64, odd_rows=6)
    got = run_pos("cpu", pos_model(torch.float32, torch.int64, H, pos, bias=True), qkv, cu, pos, bias=bias)
    check(got, qkv, cu, H, pos, bias=bias)


H, D, GRID = 2, 4, (2, 3)
R = pos_table_size(GRID)  # 18


def expect_refused(match: str, *, model_kw: dict, feeds: dict, at_creation: bool = False) -> None:
    model = attention_model(torch.float32, torch.int64, H, any_rank=True, **model_kw)
    with pytest.raises(Exception) as info:
        sess = create_session(model, "cpu")
        assert not at_creation, "session creation should have failed"
        run_with_iobinding(sess, feeds, output_device="cpu")
    text = str(info.value)
    for part in match.split(" && "):
        assert part in text, f"{part!r} not in {text!r}"


def feeds(T=5, table=(H, R), tp=5, tp_dtype=torch.int64, table_dtype=torch.float32) -> dict:
    out = {"qkv": torch.randn(T, 3 * H * D), "cu_seqlens": torch.tensor([0, T])}
    if table is not None:
        out["pos_table"] = torch.zeros(table, dtype=table_dtype)
    if tp is not None:
        out["token_pos"] = torch.zeros(tp, dtype=tp_dtype)
    return out


POS = {"pos_elems": (TensorProto.FLOAT, TensorProto.INT64), "grid_h": 2, "grid_w": 3, "num_prefix": 1}


@pytest.mark.parametrize(
    ("match", "model_kw", "inputs"),
    [
        (
            "input 'pos_table' must be [num_heads, (2*grid_h-1)*(2*grid_w-1)+3] = [2, 18], got shape [2, 17] && "
            "qkv shape [5, 24]",
            POS,
            feeds(table=(H, R - 1)),
        ),
        ("input 'pos_table' must be [num_heads", POS, feeds(table=(H * R,))),
        ("= [2, 18], got shape [3, 18]", POS, feeds(table=(3, R))),
        ("input 'token_pos' must be 1-D [5] (one entry per qkv row), got shape [4]", POS, feeds(tp=4)),
        ("input 'token_pos' must be 1-D [5]", POS, feeds(tp=(5, 1))),
        (
            "input 'pos_table' needs input 'token_pos' too",
            {**POS, "pos_elems": (TensorProto.FLOAT, None)},
            feeds(tp=None),
        ),  # fmt: skip
        (
            "input 'token_pos' needs input 'pos_table' too",
            {**POS, "pos_elems": (None, TensorProto.INT64)},
            feeds(table=None),
        ),  # fmt: skip
        (
            "attributes 'grid_h' and 'grid_w' must be >= 1 with input 'pos_table' && grid_h = 0",
            {**POS, "grid_h": 0},
            feeds(),
        ),  # fmt: skip
        ("attributes 'grid_h' and 'grid_w' must be >= 1", {"pos_elems": POS["pos_elems"]}, feeds()),
    ],
)
def test_bad_pos_inputs_are_named_errors(ort_library, match, model_kw, inputs):
    expect_refused(match, model_kw=model_kw, feeds=inputs)


@pytest.mark.parametrize(
    ("model_kw", "match"),
    [
        ({**POS, "grid_h": -1}, "attribute 'grid_h' must be >= 0, got -1"),
        ({**POS, "num_prefix": -3}, "attribute 'num_prefix' must be >= 0, got -3"),
        ({**POS, "grid_w": 2.0}, "attribute 'grid_w' must be an int, got a float"),
        ({**POS, "grid_h": 2**62, "grid_w": 2**62}, "overflows int64"),
        ({**POS, "grid_h": 2**31, "grid_w": 2**31, "num_prefix": 2**62}, "overflows int64"),
        # pos_table is declared float: ORT refuses other types (token_pos of the other int type reaches the kernel:
        # tests/custom_ops/test_op_checks.py)
        (
            {**POS, "pos_elems": (TensorProto.DOUBLE, TensorProto.INT64)},
            "Type 'tensor(double)' of input parameter (pos_table)",
        ),
    ],
)
def test_bad_pos_attributes_and_types_fail_at_session_creation(ort_library, model_kw, match):
    expect_refused(match, model_kw=model_kw, feeds=feeds(), at_creation=True)


def test_huge_grid_without_the_table_size(ort_library):
    """A grid whose table cannot exist: the shape check names the expected size, nothing is allocated from it."""
    kw = {**POS, "grid_h": 2**20, "grid_w": 2**20}
    expect_refused("= [2, 4398042316804], got shape [2, 18]", model_kw=kw, feeds=feeds())


def test_without_pos_the_inputs_may_be_absent_or_empty(ort_library, gen):
    """Trailing empty pos inputs (and grid attributes) change nothing."""
    qkv, cu = random_batch(gen, 3, 9, H, D, torch.float32, torch.int64)
    model = attention_model(torch.float32, torch.int64, H, pos_elems=(None, None), grid_h=2, grid_w=3)
    sess = create_session(model, "cpu")
    out, cls = run_with_iobinding(sess, {"qkv": qkv, "cu_seqlens": cu}, output_device="cpu")
    want, want_cls = ragged_attention_reference(qkv, cu, H, return_cls_attn=True, compute_dtype=torch.float64)
    assert_close(torch.from_numpy(out.numpy()), want.float(), name="out")
    assert_close(torch.from_numpy(cls.numpy()), want_cls.float(), name="cls_attn")
