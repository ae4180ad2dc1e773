"""com.raggedvit::RaggedSelect: CPU EP vs the torch op's CPU math (select_rows_reference), error statuses, and the
CUDA EP (GPU only)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raggedvit.pruning.select import select_rows_reference
from raggedvit.runtime import create_session
from tests.support.ort_models import SELECT_OUTPUTS, select_model
from tests.support.select_cases import SELECT_CASES, SelectCase, make_select_inputs


def attrs_of(case: SelectCase, bound: int) -> dict[str, int | float]:
    return {"width": case.width, "bound": bound, "num_prefix": case.num_prefix, "policy": case.policy,
            "keep": case.keep, "mass": case.mass}  # fmt: skip


def run(model: bytes, scores: np.ndarray, cu: np.ndarray, provider: str = "cpu") -> list[np.ndarray]:
    sess = create_session(model, provider, intra_op_threads=1)
    return sess.run(None, {"scores": scores, "cu": cu})


def expected(case: SelectCase, scores: torch.Tensor, cu: torch.Tensor, bound: int) -> list[np.ndarray]:
    ref = select_rows_reference(scores, cu, case.width, bound, case.num_prefix, case.policy, case.keep, case.mass)
    return [t.numpy() for t in ref]


@pytest.mark.parametrize("case", SELECT_CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cpu_ep_equals_torch_op(ort_library, case, seed):
    scores, cu, bound = make_select_inputs(case, seed)
    got = run(select_model(attrs_of(case, bound)), scores.numpy(), cu.numpy())
    for name, g, r in zip(SELECT_OUTPUTS, got, expected(case, scores, cu, bound)):
        np.testing.assert_array_equal(g, r, err_msg=name)


@pytest.mark.parametrize("B", [1, 3, 8])
@pytest.mark.parametrize("policy", [0, 1])
def test_cpu_ep_continuous_scores(ort_library, B, policy):
    """Softmax-like scores (the cls attention): every output equal, the cls-mass k included."""
    gen = torch.Generator().manual_seed(B)
    case = SelectCase("soft", B, 197, 0, 1, policy, 0.7, 0.9)
    n = torch.randint(60, 198, (B,), generator=gen)
    cu = torch.cat((torch.zeros(1, dtype=torch.int64), n.cumsum(0)))
    scores = torch.softmax(torch.randn(int(cu[-1]), generator=gen) * 3, dim=0)
    got = run(select_model(attrs_of(case, 197)), scores.numpy(), cu.numpy())
    for name, g, r in zip(SELECT_OUTPUTS, got, expected(case, scores, cu, 197)):
        np.testing.assert_array_equal(g, r, err_msg=name)


GOOD = {"width": 8, "bound": 8, "num_prefix": 1, "policy": 1, "keep": 0.5, "mass": 0.9}
BAD_ATTRS = [
    ({"width": 0}, "attribute 'width' must be >= 1, got 0"),
    ({"bound": 9}, "attribute 'bound' must be in [0, 8], got 9"),
    ({"num_prefix": -1}, "attribute 'num_prefix' must be >= 0, got -1"),
    ({"policy": 2}, "attribute 'policy' must be in [0, 1], got 2"),
    ({"width": 8.0}, "attribute 'width' must be an int, got a float"),
    ({"keep": 1}, "attribute 'keep' must be a float, got an int (1)"),
]


@pytest.mark.parametrize(("change", "message"), BAD_ATTRS, ids=lambda v: str(v)[:30])
def test_attribute_errors(ort_library, change, message):
    with pytest.raises(Exception) as info:  # noqa: PT011 (refused at session creation)
        run(select_model(GOOD | change), np.zeros(4, np.float32), np.array([0, 4], np.int64))
    assert "RaggedSelect: " + message in str(info.value)


BAD_CU = [
    ([0, 5, 3], "must be non-decreasing, got cu[2] = 3 < cu[1] = 5"),
    ([0, 4, 12], "cu[2] = 12 exceeds T = 10"),
    ([0, 9, 10], "image 0 has 9 rows, above attribute width = 8"),
    ([-1, 3], "must start at >= 0, got cu[0] = -1"),
    ([0], "input 'cu' must be 1-D [B+1] with B >= 1"),
]


@pytest.mark.parametrize(("cu", "message"), BAD_CU, ids=lambda v: str(v)[:30])
def test_cu_errors(ort_library, cu, message):
    with pytest.raises(Exception) as info:  # noqa: PT011 (ORT's status exceptions have no common base)
        run(select_model(GOOD, any_rank=True), np.zeros(10, np.float32), np.array(cu, np.int64))
    assert message in str(info.value)


def test_input_errors(ort_library):
    with pytest.raises(Exception) as info:  # noqa: PT011
        run(select_model(GOOD, any_rank=True), np.zeros((2, 5), np.float32), np.array([0, 4], np.int64))
    assert "input 'scores' must be 1-D [T] (scores shape [2, 5], cu shape [2])" in str(info.value)


@pytest.mark.parametrize("provider", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU")])])  # fmt: skip
def test_a_width_far_beyond_the_input_is_refused(ort_library, provider):
    """width 2**30 on one row: refused before any slot table is allocated (it took 1.1 GiB and 2.5 s), with the
    limit max(T, 65536) in the message; the limit itself is accepted."""
    huge = GOOD | {"width": 2**30, "bound": 1, "num_prefix": 0}
    with pytest.raises(Exception) as info:  # noqa: PT011
        run(select_model(huge), np.ones(1, np.float32), np.array([0, 1], np.int64), provider)
    assert ("RaggedSelect: attribute 'width' = 1073741824 is far beyond the input: an image has at most T = 1 rows, "
            "so width may be at most max(T, 65536) = 65536; set it to the rows per image before the stage (scores "
            "shape [1], cu shape [2])") in str(info.value)  # fmt: skip
    src, *_ = run(select_model(huge | {"width": 65536}), np.ones(1, np.float32), np.array([0, 1], np.int64), provider)
    assert src.tolist() == [0]


def test_dead_rows_and_empty_capacity(ort_library):
    """bound 0: empty src / seq_id / pos, cu_new and k still computed; rows past cu[B] never read."""
    scores = np.array([0.5, 0.1, 0.9, 0.3, np.nan, np.nan], np.float32)  # rows 4, 5: dead
    cu = np.array([0, 4], np.int64)
    src, cu_new, seq_id, pos, k = run(select_model(GOOD | {"bound": 0}), scores, cu)
    assert src.shape == seq_id.shape == pos.shape == (0,)
    np.testing.assert_array_equal(cu_new, [0, 1 + k[0]])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", SELECT_CASES, ids=lambda c: c.name)
def test_cuda_ep_equals_cpu_ep(ort_library, case):
    scores, cu, bound = make_select_inputs(case)
    model = select_model(attrs_of(case, bound))
    cpu = run(model, scores.numpy(), cu.numpy())
    gpu = run(model, scores.numpy(), cu.numpy(), provider="cuda")
    for name, g, r in zip(SELECT_OUTPUTS, gpu, cpu):
        np.testing.assert_array_equal(g, r, err_msg=name)
