"""Every bad input of RaggedAttention (CPU EP) raises an ORT error whose text names the argument and shapes."""

from __future__ import annotations

import pytest
import torch
from onnx import TensorProto

from raggedvit.runtime import create_session, run_with_iobinding
from tests.support.ort_models import attention_model

H, D = 2, 4
W = 3 * H * D


def run(qkv: torch.Tensor, cu: torch.Tensor, *, num_heads: int | None = H, **kw) -> None:
    qkv_elem = TensorProto.DOUBLE if qkv.dtype == torch.float64 else None
    model = attention_model(torch.float32, cu.dtype, num_heads, any_rank=True, qkv_elem=qkv_elem, **kw)
    sess = create_session(model, "cpu")
    run_with_iobinding(sess, {"qkv": qkv, "cu_seqlens": cu}, output_device="cpu")


def expect_error(match: str, qkv: torch.Tensor, cu: torch.Tensor, **kw) -> str:
    with pytest.raises(Exception) as info:
        run(qkv, cu, **kw)
    text = str(info.value)
    assert "RaggedAttention" in text, text
    for part in match.split(" && "):
        assert part in text, f"{part!r} not in {text!r}"
    return text


def qkv(T: int = 5, width: int = W) -> torch.Tensor:
    return torch.randn(T, width)


@pytest.mark.parametrize(
    ("match", "make_qkv", "cu", "kw"),
    [
        ("input 'qkv' must be 2-D && qkv shape [2, 5, 24]", lambda: torch.randn(2, 5, W), [0, 5], {}),
        ("input 'qkv' must be 2-D && qkv shape [24]", lambda: torch.randn(W), [0, 5], {}),
        (
            "input 'qkv' width 20 must be a positive multiple of 3*num_heads = 6 && qkv shape [5, 20]",
            lambda: qkv(width=20),
            [0, 5],
            {},
        ),
        ("input 'qkv' width 0 && qkv shape [5, 0]", lambda: qkv(width=0), [0, 5], {}),
        ("input 'qkv' (shape [5, 24]) has element type double", lambda: qkv().double(), [0, 5], {}),
        ("input 'cu_seqlens' must be 1-D && cu_seqlens shape [1, 2]", qkv, [[0, 5]], {}),
        ("input 'cu_seqlens' must hold B+1 >= 1 offsets, got length 0 && cu_seqlens shape [0]", qkv, [], {}),
        ("B = 0 sequences but input 'qkv' has T = 5 rows && cu_seqlens shape [1]", qkv, [0], {}),
        ("must start at 0, got cu_seqlens[0] = 1 && qkv shape [5, 24]", qkv, [1, 5], {}),
        ("must be non-decreasing, got cu_seqlens[2] = 1 < cu_seqlens[1] = 3 && shape [4]", qkv, [0, 3, 1, 5], {}),
        ("must be non-decreasing, got cu_seqlens[1] = -1 < cu_seqlens[0] = 0", qkv, [0, -1, 5], {}),
        ("cu_seqlens[1] = 9 exceeds T = 5 && qkv shape [5, 24]", qkv, [0, 9, 5], {}),
        ("cu_seqlens[2] = 6 exceeds T = 5 && qkv shape [5, 24]", qkv, [0, 2, 6], {}),
        (
            "sequence 1 has length 4 above attribute max_seqlen = 3 && qkv shape [5, 24]",
            qkv,
            [0, 1, 5],
            {"max_seqlen": 3},
        ),
    ],
)
@pytest.mark.parametrize("cu_dtype", [torch.int32, torch.int64])
def test_bad_inputs_raise_named_errors(ort_library, match, make_qkv, cu, kw, cu_dtype):
    expect_error(match, make_qkv(), torch.tensor(cu, dtype=cu_dtype), **kw)


@pytest.mark.parametrize(
    ("num_heads", "kw", "match"),
    [
        (0, {}, "attribute 'num_heads' must be in [1, 3074457345618258602], got 0"),
        (-2, {}, "attribute 'num_heads' must be in [1, 3074457345618258602], got -2"),
        (None, {}, "attribute 'num_heads' (int) is required"),
        (H, {"max_seqlen": -1}, "attribute 'max_seqlen' must be >= 0, got -1"),
        # 3*num_heads overflows int64 (0x5555555555555555: to -1, so every width was a "multiple")
        (0x5555555555555555, {}, "attribute 'num_heads' must be in [1, 3074457345618258602], got 6148914691236517205"),
        (2**62, {}, "attribute 'num_heads' must be in [1, 3074457345618258602], got 4611686018427387904"),
        (2**63 - 1, {}, "attribute 'num_heads' must be in [1, 3074457345618258602], got 9223372036854775807"),
        (-(2**63), {}, "attribute 'num_heads' must be in [1, 3074457345618258602], got -9223372036854775808"),
        (2.0, {}, "attribute 'num_heads' must be an int, got a float"),
        (H, {"scale": 2}, "attribute 'scale' must be a float, got an int (2)"),
        (H, {"scale": float("nan")}, "attribute 'scale' must be a finite float, got nan"),
        (H, {"max_seqlen": 16.0}, "attribute 'max_seqlen' must be an int, got a float"),
    ],
)
def test_bad_attributes_fail_at_session_creation(ort_library, num_heads, kw, match):
    model = attention_model(torch.float32, torch.int64, num_heads, **kw)
    with pytest.raises(Exception) as info:
        sess = create_session(model, "cpu")
        run_with_iobinding(sess, {"qkv": qkv(), "cu_seqlens": torch.tensor([0, 5])}, output_device="cpu")
    assert match in str(info.value), str(info.value)


@pytest.mark.parametrize("num_heads", [(2**63 - 1) // 3, 2**31, 2**32 + 1])
def test_huge_num_heads_fail_the_width_check(ort_library, num_heads):
    """num_heads whose 3*num_heads fits int64 but exceeds any width: the op's shape check, not a crash."""
    expect_error(f"must be a positive multiple of 3*num_heads = {3 * num_heads}", qkv(), torch.tensor([0, 5]),
                 num_heads=num_heads)  # fmt: skip


def test_errors_do_not_poison_the_session(ort_library):
    """A failed call returns a status; the same session then runs a valid batch."""
    sess = create_session(attention_model(torch.float32, torch.int64, H), "cpu")
    with pytest.raises(Exception, match="exceeds T = 5"):
        run_with_iobinding(sess, {"qkv": qkv(), "cu_seqlens": torch.tensor([0, 9])}, output_device="cpu")
    out, cls = run_with_iobinding(sess, {"qkv": qkv(), "cu_seqlens": torch.tensor([0, 3, 5])}, output_device="cpu")
    assert out.shape() == [5, H * D]
