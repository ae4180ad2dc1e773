"""com.raggedvit::RaggedViTBlock on the CPU EP against vit_block_reference (fp32 within 1e-5, the fp16 recipes
within a few fp16 ulps), and its refusals: ORT errors naming the input (or attribute) and the shapes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _block_cases import NAMES, OPTIONAL, block_model, random_feeds, reference, session

C, F, HEADS = 32, 64, 4
LENGTHS = [5, 0, 9, 1]
T = sum(LENGTHS) + 3  # three dead rows
ATTRS = {"num_heads": HEADS, "epsilon": 1e-6, "scale": 0.3}


def _elems(feeds):
    return {n: {np.float32: "float", np.float16: "float16", np.int64: "int64", np.int32: "int32",
                np.float64: "double"}[feeds[n].dtype.type] for n in feeds}  # fmt: skip


def _run(feeds, library, attrs=ATTRS, cls_attn=True):
    return session(block_model(_elems(feeds), attrs, cls_attn=cls_attn), library).run(None, feeds)


@pytest.mark.parametrize(
    ("stream", "gemm", "tol"), [("float", "float", 1e-5), ("float", "float16", 2e-3), ("float16", "float16", 2e-3)]
)
@pytest.mark.parametrize("optional", ["all", "none"])
def test_matches_reference(ort_library, stream, gemm, tol, optional):
    rng = np.random.default_rng(0)
    present = set(NAMES) if optional == "all" else set(NAMES) - OPTIONAL
    feeds = random_feeds(rng, T, C, F, LENGTHS, stream, gemm, present)
    y, cls = _run(feeds, ort_library)
    gold_y, gold_cls = reference(feeds, HEADS, 1e-6, 0.3)
    assert y.dtype == feeds["x"].dtype and y.shape == (T, C) and cls.dtype == np.float32
    scale = float(gold_y.abs().max())
    assert np.abs(y.astype(np.float64) - gold_y.numpy()).max() <= tol * scale
    assert np.abs(cls - gold_cls.numpy()).max() <= tol
    assert not y[sum(LENGTHS) :].any() and not cls[sum(LENGTHS) :].any()
    (y_only,) = _run(feeds, ort_library, cls_attn=False)
    np.testing.assert_array_equal(y_only, y)


def test_int32_cu_seqlens(ort_library):
    feeds = random_feeds(np.random.default_rng(1), T, C, F, LENGTHS, "float", "float", set(NAMES))
    y64, _ = _run(feeds, ort_library)
    y32, _ = _run({**feeds, "cu_seqlens": feeds["cu_seqlens"].astype(np.int32)}, ort_library)
    np.testing.assert_array_equal(y32, y64)


def _refusal(feeds, library, attrs=ATTRS) -> str:
    with pytest.raises(Exception) as info:  # noqa: PT011 (onnxruntime's own exception types)
        _run(feeds, library, attrs)
    return str(info.value)


def test_bad_inputs_name_the_input_and_shapes(ort_library):
    good = random_feeds(np.random.default_rng(2), T, C, F, LENGTHS, "float", "float16", set(NAMES))
    cases = [
        ({"qkv_weight": good["qkv_weight"][:-1]}, "input 'qkv_weight' must be [96, 32], got shape [95, 32]"),
        ({"fc2_weight": good["fc2_weight"].T.copy()}, "input 'fc2_weight' must be [32, 64], got shape [64, 32]"),
        ({"ls2": good["ls2"][None]}, "input 'ls2' must be [32], got shape [1, 32]"),
        ({"norm1_bias": good["norm1_bias"].astype(np.float16)}, "input 'norm1_bias' (shape [32]) has element type "
         "float16, x has float"),
        ({"proj_bias": good["proj_bias"].astype(np.float32)}, "input 'proj_bias' (shape [32]) has element type float, "
         "qkv_weight has float16"),
        ({"x": good["x"][:, :30]}, "input 'fc1_weight' must be 2-D [F, C] with C = 30"),
        ({"cu_seqlens": np.array([0, 5, 3, 20])}, "input 'cu_seqlens' (shape [4], x shape [18, 32]) must be "
         "non-decreasing"),
        ({"cu_seqlens": np.array([0, 19])}, "cu_seqlens[1] = 19 exceeds T = 18"),
        ({"x": np.zeros((0, 2**40), np.float32), "fc1_weight": np.zeros((0, 2**40), np.float16),
          "cu_seqlens": np.array([0])}, "overflow int64 bytes (x shape [0, 1099511627776]"),
    ]  # fmt: skip
    for change, text in cases:
        message = _refusal({**good, **change}, ort_library)
        assert "RaggedViTBlock: " + text in message or text in message, (text, message)


def test_bad_attributes_are_named(ort_library):
    feeds = random_feeds(np.random.default_rng(3), T, C, F, LENGTHS, "float", "float", set(NAMES))
    cases = [
        ({"epsilon": 1e-6, "scale": 0.3}, "attribute 'num_heads' (int) is required"),
        ({**ATTRS, "num_heads": 5}, "attribute 'num_heads' must divide C = 32 (x shape [18, 32]"),
        ({**ATTRS, "num_heads": 0}, "attribute 'num_heads' must be >= 1"),
        ({**ATTRS, "epsilon": 1}, "attribute 'epsilon' must be a float, got an int"),
        ({**ATTRS, "scale": float("inf")}, "attribute 'scale' must be a finite float"),
    ]
    for attrs, text in cases:
        assert text in _refusal(feeds, ort_library, attrs)


def test_matches_torch_op(ort_library):
    """The ORT kernel and torch.ops.raggedvit.vit_block (CPU) on the same fp32 inputs."""
    feeds = random_feeds(np.random.default_rng(4), T, C, F, LENGTHS, "float", "float", set(NAMES))
    y, cls = _run(feeds, ort_library)
    t = [torch.from_numpy(feeds[n]) if n in feeds else None for n in NAMES]
    ty, tcls = torch.ops.raggedvit.vit_block(*t, HEADS, 1e-6, 0.3, True)
    np.testing.assert_allclose(y, ty.numpy(), rtol=1e-5, atol=1e-5 * float(ty.abs().max()))
    np.testing.assert_allclose(cls, tcls.numpy(), rtol=1e-5, atol=1e-6)
