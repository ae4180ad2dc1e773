"""The findings the shared checks (raggedvit/custom_ops/op_checks.h) fix, one test each: an int epsilon, RaggedSelect's
keep outside (0, 1] (the op and its torch reference), PatchEmbed's wrapping grid, a token_pos of the other int type.
Every attribute of every op at the wrong type and limit values, and sizes near 2**63 on six of the seven ops, are the
crafted cases of the CPU fuzz (tests/custom_ops/fuzz/attrs.py, test_fuzz_cpu.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto

from raggedvit.pruning.select import select_rows_reference
from raggedvit.runtime import create_session
from tests.support.ort_models import (
    attention_model,
    embed_model,
    norm_model,
    select_model,
)

F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16
SELECT = {"width": 4, "bound": 4, "num_prefix": 1, "policy": 0, "keep": 0.5, "mass": 0.0}


def refused(model: bytes, feeds: dict | None = None) -> str:
    """The error text of creating a CPU session for `model` and (if that succeeds) running it on `feeds`."""
    with pytest.raises(Exception) as info:
        sess = create_session(model, "cpu")
        sess.run_with_ort_values(None, {k: _ort(v) for k, v in (feeds or {}).items()})
    text = str(info.value)
    assert type(info.value).__module__.startswith("onnxruntime"), text  # an ORT status, not a crash or a bug
    return text


def _ort(v):
    import onnxruntime as ort

    if isinstance(v, tuple):  # (shape, numpy dtype): a tensor with a zero dim and others near 2**63
        return ort.OrtValue.ortvalue_from_shape_and_type(list(v[0]), v[1], "cpu")
    return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(v))


def test_int_epsilon_is_refused_not_ignored(ort_library):
    """GatherLayerNorm with epsilon=100 given as an INT attribute: refused (it used to run with 1e-5)."""
    text = refused(norm_model(F32, skip=False, bias=False, epsilon=100))
    assert "attribute 'epsilon' must be a float, got an int (100)" in text, text


@pytest.mark.parametrize("keep", [1e20, 1.5, 0.0, -0.1, float("nan"), float("inf")])
def test_select_keep_outside_0_1_is_refused_by_op_and_reference(ort_library, keep):
    text = refused(select_model({**SELECT, "keep": keep}))
    assert "RaggedSelect: attribute 'keep' must be a finite float in (0, 1]" in text, text
    scores, cu = torch.rand(8), torch.tensor([0, 4, 8])
    with pytest.raises(ValueError, match=r"keep must be in \(0, 1\]"):
        select_rows_reference(scores, cu, 4, 4, 1, 0, keep, 0.0)


def test_select_mass_policy_needs_mass_in_0_1(ort_library):
    assert "attribute 'mass' must be a finite float in (0, 1]" in refused(select_model({**SELECT, "policy": 1}))
    with pytest.raises(ValueError, match=r"mass must be in \(0, 1\]"):
        select_rows_reference(torch.rand(8), torch.tensor([0, 4, 8]), 4, 4, 1, 1, 0.0, 0.0)
    with pytest.raises(ValueError, match=r"keep must be in \[0, 1\]"):  # the unused fraction: 0 or in (0, 1]
        select_rows_reference(torch.rand(8), torch.tensor([0, 4, 8]), 4, 4, 1, 1, 2.0, 0.9)


def test_select_keep_1_and_mass_policy_with_keep_0_still_run(ort_library):
    scores, cu = np.random.default_rng(0).random(8).astype(np.float32), np.array([0, 4, 8])
    for attrs in ({**SELECT, "keep": 1.0}, {**SELECT, "policy": 1, "keep": 0.0, "mass": 0.9}):
        got = create_session(select_model(attrs), "cpu").run(None, {"scores": scores, "cu": cu})
        ref = select_rows_reference(torch.from_numpy(scores), torch.from_numpy(cu), 4, 4, 1, attrs["policy"],
                                    attrs["keep"], attrs["mass"])  # fmt: skip
        for g, r in zip(got, ref):
            np.testing.assert_array_equal(g, r.numpy())


BIG = 0x6DB6DB6DB6DB6DB7  # * 7 wraps int64 to 1


def _embed_feeds(images):
    return {"Images": images, "Weight": np.zeros((0, 4), np.float16), "Prefix": np.zeros((1, 4), np.float32),
            "Pos": np.zeros((2, 4), np.float32)}  # fmt: skip


def test_patch_grid_does_not_wrap(ort_library):
    """Images [1, 0, 0x6DB6DB6DB6DB6DB7, 7], patch 1: gh * gw wraps int64 to 1, which used to accept Pos [P+1, N]."""
    text = refused(embed_model(patch=1), _embed_feeds(((1, 0, BIG, 7), np.float32)))
    assert "PatchEmbed: Images shape [1, 0, 7905747460161236407, 7] and patch 1 overflow int64" in text, text


def test_select_sizes_near_2_63(ort_library):
    """width and bound near 2**63: refused, naming the attribute, as far beyond the input before B * width slots
    could overflow (that check stays behind it; with the width at most max(T, 2**16) no input held in memory
    reaches it)."""
    attrs = {**SELECT, "width": 2**62, "bound": 2**62}
    text = refused(select_model(attrs), {"scores": np.zeros(4, np.float32), "cu": np.array([0, 2, 4])})
    assert "RaggedSelect: attribute 'width' = 4611686018427387904 is far beyond the input" in text, text
    assert "width may be at most max(T, 65536) = 65536" in text, text


def test_token_pos_of_the_other_int_type_names_it_and_the_types(ort_library):
    """RaggedAttention with token_pos int32 and cu_seqlens int64: the kernel's check, not "no kernel def matches"."""
    model = attention_model(torch.float32, torch.int64, 2, pos_elems=(F32, TensorProto.INT32), grid_h=2, grid_w=2,
                            num_prefix=1)  # fmt: skip
    feeds = {"qkv": np.random.rand(5, 12).astype(np.float32), "cu_seqlens": np.array([0, 5]),
             "pos_table": np.zeros((2, 12), np.float32), "token_pos": np.arange(5, dtype=np.int32)}  # fmt: skip
    text = refused(model, feeds)
    assert "input 'token_pos'" in text and "int32 or int64" in text and "got int32" in text, text
    assert "no kernel def" not in text
