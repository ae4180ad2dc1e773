"""RaggedAttention's per-key bias (input 5, key_bias [T] float: ToMe's proportional attention) on ORT's CPU EP and,
on a GPU, the CUDA EP (the AOT HAS_KEY_BIAS cubins) vs the float64 reference; bad key_bias inputs are statuses
naming the input and the shapes."""

from __future__ import annotations

import pytest
import torch
from _relpos_cases import CU_ELEM, relpos_inputs
from onnx import TensorProto

from raggedvit.kernels.reference import ragged_attention_reference
from raggedvit.runtime import create_session, run_with_iobinding
from tests.support.ort_models import DTYPES, attention_model, random_batch
from tests.support.testing import assert_close

CPU_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
CUDA_TOL = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3.2e-2}


def _key_bias(T: int, gen: torch.Generator) -> torch.Tensor:
    """log of token sizes 1..8: what tome passes."""
    return torch.randint(1, 9, (T,), generator=gen).float().log()


def _run(device, dtype, cu_dtype, H, qkv, cu, kb, *, cls_attn=True, bias=None, pos=None):
    kw = {}
    if pos is not None:
        kw = {"pos_elems": (TensorProto.FLOAT, CU_ELEM[cu_dtype]), "grid_h": pos["grid"][0],
              "grid_w": pos["grid"][1], "num_prefix": pos["num_prefix"]}  # fmt: skip
    model = attention_model(
        dtype, cu_dtype, H, cls_attn=cls_attn, bias_elem=DTYPES[dtype] if bias is not None else None,
        key_bias_elem=TensorProto.FLOAT, **kw,
    )  # fmt: skip
    sess = create_session(model, device, disable_cpu_fallback=device == "cuda")
    T, W = qkv.shape
    outputs = {"out": torch.full((T, W // 3), float("nan"), dtype=qkv.dtype, device=device)}
    if cls_attn:
        outputs["cls_attn"] = torch.full((T,), float("nan"), device=device)
    feeds = {"qkv": qkv, "cu_seqlens": cu, "key_bias": kb}
    if bias is not None:
        feeds["bias"] = bias
    if pos is not None:
        feeds.update(pos_table=pos["pos_table"], token_pos=pos["token_pos"])
    run_with_iobinding(sess, {k: v.to(device) for k, v in feeds.items()}, outputs)
    if device == "cuda":
        torch.cuda.synchronize()
    return {k: v.cpu() for k, v in outputs.items()}


def _check(got, qkv, cu, H, kb, rtol, *, bias=None, pos=None):
    x = qkv if bias is None else (qkv.float() + bias.float()).to(qkv.dtype)
    out, cls = ragged_attention_reference(
        x, cu, H, return_cls_attn=True, compute_dtype=torch.float64, key_bias=kb, **(pos or {})
    )
    assert_close(got["out"], out.to(qkv.dtype), rtol=rtol, name="out")
    if "cls_attn" in got:
        assert_close(got["cls_attn"], cls.float(), rtol=rtol, name="cls_attn")


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("cu_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("with_cls", [True, False])
def test_cpu_ep_matches_reference(ort_library, gen, dtype, cu_dtype, with_cls):
    H, D = 3, 16
    qkv, cu = random_batch(gen, 6, 40, H, D, dtype, cu_dtype)
    kb = _key_bias(qkv.shape[0], gen)
    got = _run("cpu", dtype, cu_dtype, H, qkv, cu, kb, cls_attn=with_cls)
    _check(got, qkv, cu, H, kb, CPU_TOL[dtype])


def test_cpu_ep_with_bias_and_pos(ort_library, gen):
    H, D = 2, 8
    qkv, cu = random_batch(gen, 4, 30, H, D, torch.float32, torch.int64, allow_empty=False)
    bias = torch.randn(3 * H * D, generator=gen)
    pos = relpos_inputs((cu[1:] - cu[:-1]).tolist(), H, (3, 4), 1, gen, cu_dtype=torch.int64, odd_rows=3)
    kb = _key_bias(qkv.shape[0], gen)
    got = _run("cpu", torch.float32, torch.int64, H, qkv, cu, kb, bias=bias, pos=pos)
    _check(got, qkv, cu, H, kb, CPU_TOL[torch.float32], bias=bias, pos=pos)


@pytest.mark.parametrize(
    ("key_bias", "match"),
    [
        (torch.zeros(4), "input 'key_bias' must be 1-D [5] (one entry per qkv row, qkv shape [5, 24]), got shape [4]"),
        (torch.zeros(5, 1), "input 'key_bias' must be 1-D [5]"),
    ],
)
def test_bad_key_bias_is_a_status(ort_library, key_bias, match):
    model = attention_model(torch.float32, torch.int64, 2, any_rank=True, key_bias_elem=TensorProto.FLOAT)
    sess = create_session(model, "cpu")
    feeds = {"qkv": torch.randn(5, 24), "cu_seqlens": torch.tensor([0, 5]), "key_bias": key_bias}
    with pytest.raises(Exception) as info:
        run_with_iobinding(sess, feeds, output_device="cpu")
    assert match in str(info.value), str(info.value)


def test_key_bias_of_another_type_fails_at_session_creation(ort_library):
    """key_bias is declared float: ORT refuses a double one when the session is made, naming the input."""
    model = attention_model(torch.float16, torch.int64, 2, key_bias_elem=TensorProto.DOUBLE)
    with pytest.raises(Exception, match=r"Type 'tensor\(double\)' of input parameter \(key_bias\)"):
        create_session(model, "cpu")


def _cuda() -> bool:
    import onnxruntime as ort

    return torch.cuda.is_available() and "CUDAExecutionProvider" in ort.get_available_providers()


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs CUDA and onnxruntime-gpu")
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("cu_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("D", [32, 64, 128])
@pytest.mark.parametrize("max_len", [100, 400])  # ~800 and ~3200 rows: both launch configs (the large from 2048)
def test_cuda_ep_matches_reference(ort_library, gen, dtype, cu_dtype, D, max_len):
    H = 3
    qkv, cu = random_batch(gen, 16, max_len, H, D, dtype, cu_dtype)
    kb = _key_bias(qkv.shape[0], gen)
    bias = torch.randn(3 * H * D, generator=gen).to(dtype)
    got = _run("cuda", dtype, cu_dtype, H, qkv, cu, kb, bias=bias)
    _check(got, qkv, cu, H, kb, CUDA_TOL[dtype], bias=bias)
