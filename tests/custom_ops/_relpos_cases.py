"""Shared by the relative position bias tests of the op library: models, one run on an EP, the reference check."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from onnx import TensorProto

from raggedvit.kernels.reference import ragged_attention_reference
from raggedvit.runtime import create_session, run_with_iobinding
from tests.support.ort_models import DTYPES, attention_model
from tests.support.testing import assert_close

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
from _kernel_cases import relpos_inputs  # noqa: E402, F401  (re-exported)

CU_ELEM = {torch.int32: TensorProto.INT32, torch.int64: TensorProto.INT64}


def pos_model(dtype, cu_dtype, H, pos, *, cls_attn=True, bias=False, table_elem=TensorProto.FLOAT, tp_elem=None):
    grid_h, grid_w = pos["grid"]
    return attention_model(
        dtype, cu_dtype, H, cls_attn=cls_attn, bias_elem=DTYPES[dtype] if bias else None,
        pos_elems=(table_elem, CU_ELEM[cu_dtype] if tp_elem is None else tp_elem),
        grid_h=grid_h, grid_w=grid_w, num_prefix=pos["num_prefix"],
    )  # fmt: skip


def run_pos(device, model, qkv, cu, pos, *, bias=None, cls_attn=True):
    sess = create_session(model, device, disable_cpu_fallback=device == "cuda")
    T, W = qkv.shape
    outputs = {"out": torch.full((T, W // 3), float("nan"), dtype=qkv.dtype, device=device)}
    if cls_attn:
        outputs["cls_attn"] = torch.full((T,), float("nan"), device=device)
    feeds = {"qkv": qkv, "cu_seqlens": cu, "pos_table": pos["pos_table"], "token_pos": pos["token_pos"]}
    if bias is not None:
        feeds["bias"] = bias
    run_with_iobinding(sess, {k: v.to(device) for k, v in feeds.items()}, outputs)
    if device == "cuda":
        torch.cuda.synchronize()
    return {k: v.cpu() for k, v in outputs.items()}


def check(got, qkv, cu, H, pos, *, rtol=None, bias=None):
    x = qkv if bias is None else (qkv.float() + bias.float()).to(qkv.dtype)
    out, cls = ragged_attention_reference(x, cu, H, return_cls_attn=True, compute_dtype=torch.float64, **pos)
    assert_close(got["out"], out.to(qkv.dtype), rtol=rtol, name="out")
    if "cls_attn" in got:
        assert_close(got["cls_attn"], cls.float(), rtol=rtol, name="cls_attn")
