"""Block-engine cases run under TRITON_INTERPRET=1 (tests/kernels/test_block_engine.py starts this script):
prints JSON {case name: error string or null}. argv[1]: the seed."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import torch

from raggedvit.kernels.block_engine import block_workspace, engine_config, vit_block_engine
from raggedvit.kernels.reference import (
    BlockWeights,
    ragged_attention_reference,
    ragged_linear_reference,
    vit_block_reference,
)
from tests.support.testing import assert_close, default_tolerance

C, H, F = 64, 2, 256


def weights(gen: torch.Generator, dtype: torch.dtype, layer_scale: bool, bias: bool = True) -> BlockWeights:
    def r(*shape: int, s: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * s

    def lin(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        return r(n, k, s=k**-0.5).to(dtype), (0.1 * r(n)).to(dtype) if bias else None

    def stream(t: torch.Tensor) -> torch.Tensor:  # norms and LayerScales: the residual stream's dtype
        return t.to(dtype)

    ls = [stream(0.5 + 0.1 * r(C)) if layer_scale else None for _ in range(2)]
    norm1, norm2 = (stream(1 + 0.1 * r(C)), stream(0.1 * r(C))), (stream(1 + 0.1 * r(C)), stream(0.1 * r(C)))
    return BlockWeights(*norm1, *lin(3 * C, C), *lin(C, C), *norm2, *lin(F, C), *lin(C, F), *ls)


def check_block(gen, dtype, cu_list, T, *, layer_scale=True, cls=True, cu_dtype=torch.int64, bias=True) -> None:
    w = weights(gen, dtype, layer_scale, bias)
    x = (torch.randn(T, C, generator=gen) + 0.3).to(dtype)
    cu = torch.tensor(cu_list, dtype=cu_dtype)
    out = torch.full((T, C), float("nan"), dtype=dtype)  # poisoned: every row must be written
    res = vit_block_engine(x, cu, w, H, return_cls_attn=cls, out=out)
    y, c = res if cls else (res, None)
    gold = vit_block_reference(x, cu, w, H, return_cls_attn=cls, compute_dtype=torch.float64)
    g_y, g_c = gold if cls else (gold, None)
    live = min(max(cu_list[-1], 0), T) if len(cu_list) > 1 else 0
    assert torch.equal(y[live:], torch.zeros_like(y[live:])), "dead rows must be zeros"
    if dtype == torch.float32:
        assert_close(y, g_y, rtol=1e-5, name="y")
        if cls:
            assert_close(c, g_c, rtol=1e-5, name="cls_attn")
    else:  # the fp16 rule against the reference at the same dtypes, and against the float64 gold
        ref = vit_block_reference(x, cu, w, H, return_cls_attn=cls)
        r_y, r_c = ref if cls else (ref, None)
        assert_close(y, r_y, name="y vs reference")
        assert_close(y, g_y.to(dtype), rtol=2 * default_tolerance(dtype), name="y vs gold")
        if cls:
            assert_close(c, r_c, rtol=default_tolerance(dtype), name="cls_attn")
    if cls:
        assert torch.equal(c[live:], torch.zeros_like(c[live:])), "dead rows' cls_attn must be zeros"


def check_phases(gen, dtype) -> None:
    """Each phase run alone (phases=(p, p+1)) on the previous phases' scratch, against its reference op."""
    w = weights(gen, dtype, True)
    T, cu = 37, torch.tensor([0, 11, 11, 30], dtype=torch.int32)
    live = 30
    x = torch.randn(T, C, generator=gen).to(dtype)
    ws = block_workspace(T, C, F, H, dtype, dtype, x.device, True)
    for buf in (ws.xn, ws.qkv, ws.att, ws.hid, ws.x1):
        buf.fill_(float("nan"))
    y = torch.full_like(x, float("nan"))
    tol = 1e-5 if dtype == torch.float32 else default_tolerance(dtype)
    f64 = torch.float64

    def run(p: int) -> None:
        vit_block_engine(x, cu, w, H, phases=(p, p + 1), workspace=ws, out=y, return_cls_attn=True)

    def ln(a, g, b):
        return torch.nn.functional.layer_norm(a.double(), (C,), g.double(), b.double(), 1e-6)

    run(0)
    assert_close(ws.xn[:live], ln(x, w.norm1_weight, w.norm1_bias)[:live], rtol=tol, name="phase norm1")
    run(1)
    want = ragged_linear_reference(ws.xn, w.qkv_weight, w.qkv_bias, compute_dtype=f64)
    assert_close(ws.qkv[:live], want[:live], rtol=tol, name="phase qkv")
    run(2)
    want = ragged_attention_reference(ws.qkv, cu, H, compute_dtype=f64)
    assert_close(ws.att[:live], want[:live], rtol=tol, name="phase attn")
    run(3)
    _, want_c = ragged_attention_reference(ws.qkv, cu, H, return_cls_attn=True, compute_dtype=f64)
    assert_close(ws.cls, want_c, rtol=tol, name="phase proj: cls_attn")
    want = x.double() + w.ls1.double() * ragged_linear_reference(ws.att, w.proj_weight, w.proj_bias, compute_dtype=f64)
    assert_close(ws.x1[:live], want[:live], rtol=tol, name="phase proj")
    run(4)
    assert_close(ws.xn[:live], ln(ws.x1, w.norm2_weight, w.norm2_bias)[:live], rtol=tol, name="phase norm2")
    run(5)
    want = ragged_linear_reference(ws.xn, w.fc1_weight, w.fc1_bias, activation=1, compute_dtype=f64)
    assert_close(ws.hid[:live], want[:live], rtol=tol, name="phase fc1")
    assert torch.isnan(y).all(), "phases before fc2 must not write y"
    run(6)
    want = ws.x1.double() + w.ls2.double() * ragged_linear_reference(
        ws.hid, w.fc2_weight, w.fc2_bias, compute_dtype=f64
    )
    assert_close(y[:live], want[:live], rtol=tol, name="phase fc2")
    assert torch.equal(y[live:], torch.zeros_like(y[live:]))
    assert torch.equal(ws.ctr, torch.zeros_like(ws.ctr)), "split-K counters must be back at zero"


def check_configs(gen) -> None:
    """The whole block with other tiles and splits (no split, a 3-way split of K = 256 into 128-column slices,
    one slice empty) gives the same result within rounding."""
    w = weights(gen, torch.float32, True)
    x = torch.randn(29, C, generator=gen)
    cu = torch.tensor([0, 4, 21, 26])
    gold = vit_block_reference(x, cu, w, H, compute_dtype=torch.float64)
    base = engine_config(torch.float32)
    for cfg in (
        replace(base, split_proj=1, split_fc2=1),
        replace(base, bk=64, split_proj=3, split_fc2=3, norm_rows=2, m_fast=False, prefetch=True),
    ):
        y = vit_block_engine(x, cu, w, H, config=cfg)
        assert_close(y, gold, rtol=1e-5, name=f"y with {cfg}")


def main() -> None:
    gen = torch.Generator().manual_seed(int(sys.argv[1]))
    f32, f16 = torch.float32, torch.float16
    cases = {
        "fp32 cls ls int64": lambda: check_block(gen, f32, [0, 7, 7, 20, 35], 40),
        "fp32 no cls no ls int32": lambda: check_block(
            gen, f32, [0, 13, 33], 33, layer_scale=False, cls=False, cu_dtype=torch.int32
        ),  # fmt: skip
        "fp32 no biases": lambda: check_block(gen, f32, [0, 5, 17], 20, bias=False),
        "fp16 cls ls int32": lambda: check_block(gen, f16, [0, 1, 19, 19, 36], 40, cu_dtype=torch.int32),
        "fp16 no cls no ls": lambda: check_block(gen, f16, [0, 30], 31, layer_scale=False, cls=False),
        "fp16 all rows dead": lambda: check_block(gen, f16, [0, 0, 0], 9),
        "fp32 no sequences": lambda: check_block(gen, f32, [0], 5),
        "fp32 tile functions": lambda: check_phases(gen, f32),
        "fp16 tile functions": lambda: check_phases(gen, f16),
        "fp32 other configs": lambda: check_configs(gen),
    }
    result = {}
    for name, fn in cases.items():
        try:
            fn()
            result[name] = None
        except AssertionError as exc:
            result[name] = str(exc) or "assertion failed"
    print(json.dumps(result))


if __name__ == "__main__":
    main()
