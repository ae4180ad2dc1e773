"""The block op (raggedvit.kernels.vit_block, torch.ops.raggedvit.vit_block) against vit_block_reference: the CPU
kernel, the per-op composition the CUDA kernel falls back to, the fake kernel's shapes and the argument checks."""

from __future__ import annotations

import pytest
import torch
from timm.models.vision_transformer import Block
from torch._subclasses.fake_tensor import FakeTensorMode

from raggedvit.kernels import BlockWeights, vit_block, vit_block_reference
from raggedvit.kernels._block_op import vit_block_ops
from raggedvit.pruning.packed_block import block_weights

FP16_TOL = 2e-3  # a few fp16 ulps of the block's O(1) outputs (rounded at every store)


def _block(gen: torch.Generator, C: int = 64, heads: int = 4, init_values: float | None = 0.5) -> Block:
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    block = Block(C, heads, qkv_bias=True, init_values=init_values).eval()
    with torch.no_grad():
        for p in block.parameters():
            if p.dim() == 1:  # non-trivial norms and biases
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
    return block


def _rows(gen: torch.Generator, lengths: list[int], dead: int, C: int, dtype: torch.dtype):
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    x = torch.randn(sum(lengths) + dead, C, generator=gen).to(dtype)
    return x, cu


def _weights(block: Block, stream: torch.dtype, gemm: torch.dtype) -> BlockWeights:
    w = block_weights(block, torch.float32)
    assert w is not None
    stream_names = {"norm1_weight", "norm1_bias", "norm2_weight", "norm2_bias", "ls1", "ls2"}
    return BlockWeights(
        **{
            k: None if t is None else t.detach().to(stream if k in stream_names else gemm)
            for k, t in w._asdict().items()
        }
    )


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30))


@pytest.mark.parametrize("init_values", [None, 0.5])
def test_fp32_matches_reference(gen: torch.Generator, init_values: float | None) -> None:
    block = _block(gen, init_values=init_values)
    w = _weights(block, torch.float32, torch.float32)
    x, cu = _rows(gen, [7, 1, 12], 3, 64, torch.float32)
    gold_y, gold_cls = vit_block_reference(x, cu, w, 4, eps=1e-6, return_cls_attn=True, compute_dtype=torch.float64)
    for fn in (vit_block, torch.ops.raggedvit.vit_block):
        if fn is vit_block:
            y, cls = vit_block(x, cu, w, 4, eps=1e-6, return_cls_attn=True)
        else:
            y, cls = fn(x, cu, *w, 4, 1e-6, 0.25, True)
        assert y.dtype == torch.float32 and cls.dtype == torch.float32
        assert _rel(y, gold_y) <= 1e-5 and _rel(cls, gold_cls) <= 1e-5
        assert torch.equal(y[20:], torch.zeros(3, 64)) and torch.equal(cls[20:], torch.zeros(3))
    y_ops, cls_ops = vit_block_ops(x, cu, w, 4, eps=1e-6, scale=0.25, return_cls_attn=True)
    assert _rel(y_ops, gold_y) <= 1e-5 and _rel(cls_ops, gold_cls) <= 1e-5
    assert torch.equal(vit_block(x, cu, w, 4, eps=1e-6), y)


@pytest.mark.parametrize("stream", [torch.float32, torch.float16], ids=["fp16", "fp16-all"])
def test_fp16_matches_reference(gen: torch.Generator, stream: torch.dtype) -> None:
    block = _block(gen)
    w = _weights(block, stream, torch.float16)
    x, cu = _rows(gen, [5, 9], 2, 64, stream)
    gold_y, gold_cls = vit_block_reference(x, cu, w, 4, eps=1e-6, return_cls_attn=True, compute_dtype=torch.float64)
    y, cls = vit_block(x, cu, w, 4, eps=1e-6, return_cls_attn=True)
    y_ops, cls_ops = vit_block_ops(x, cu, w, 4, eps=1e-6, scale=0.25, return_cls_attn=True)
    assert y.dtype == y_ops.dtype == stream
    for out, c in ((y, cls), (y_ops, cls_ops)):
        assert _rel(out, gold_y) <= FP16_TOL and _rel(c, gold_cls) <= FP16_TOL
        assert torch.equal(out[14:].float(), torch.zeros(2, 64))


def test_fake_shapes() -> None:
    with FakeTensorMode():
        C, F = 64, 256
        x = torch.empty(10, C, dtype=torch.float16)
        cu = torch.empty(3, dtype=torch.int64)
        norm = torch.empty(C, dtype=torch.float16)
        ws = (norm, norm, torch.empty(3 * C, C, dtype=torch.float16), None, torch.empty(C, C, dtype=torch.float16),
              None, norm, norm, torch.empty(F, C, dtype=torch.float16), None, torch.empty(C, F, dtype=torch.float16),
              None, None, None)  # fmt: skip
        y, cls = torch.ops.raggedvit.vit_block(x, cu, *ws, 4, 1e-6, 0.125, True)
        assert y.shape == (10, C) and y.dtype == torch.float16
        assert cls.shape == (10,) and cls.dtype == torch.float32
        _, none = torch.ops.raggedvit.vit_block(x, cu, *ws, 4, 1e-6, 0.125, False)
        assert none.shape == (0,)


def test_bad_arguments_name_the_argument(gen: torch.Generator) -> None:
    w = _weights(_block(gen), torch.float32, torch.float32)
    x, cu = _rows(gen, [4], 0, 64, torch.float32)
    cases = [
        ((x[0], cu, w, 4), "x must be 2-D"),
        ((x, cu[None], w, 4), "cu_seqlens must be 1-D"),
        ((x, cu.float(), w, 4), "cu_seqlens dtype"),
        ((x, cu, w, 5), "num_heads must divide C = 64"),
        ((x, cu, w._replace(qkv_bias=w.qkv_bias[:10]), 4), r"qkv_bias must be \[192\]"),
        ((x, cu, w._replace(fc2_weight=w.fc2_weight.t()), 4), r"fc2_weight must be \[64, 256\]"),
        ((x, cu, w._replace(ls1=w.ls1.half()), 4), "ls1 .* must be torch.float32"),
        ((x, cu, w._replace(proj_bias=w.proj_bias.half()), 4), "proj_bias .* GEMM dtype"),
    ]
    for args, match in cases:
        with pytest.raises(ValueError, match=match):
            vit_block(*args)


def test_block_weights_refuses_other_blocks(gen: torch.Generator) -> None:
    block = _block(gen)
    assert block_weights(block, torch.float32) is not None
    assert block_weights(block, torch.float16) is None  # norms in another dtype than the stream
    qk = Block(64, 4, qk_norm=True).eval()
    assert block_weights(qk, torch.float32) is None
    tanh = Block(64, 4).eval()
    tanh.mlp.act = torch.nn.GELU(approximate="tanh")
    assert block_weights(tanh, torch.float32) is None
    assert block_weights(Block(64, 4).train(), torch.float32) is None


def test_cuda_dispatch_engine_then_ops(gen: torch.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """vit_block_cuda's choice (run here on CPU tensors): the block engine's result when it takes the call, the
    per-op composition when the engine module is missing or refuses the case with TypeError."""
    import sys
    import types

    from raggedvit.kernels._block_op import vit_block_cuda

    w = _weights(_block(gen), torch.float32, torch.float32)
    x, cu = _rows(gen, [6, 3], 1, 64, torch.float32)
    kwargs = {"eps": 1e-6, "scale": 0.25, "return_cls_attn": True}
    want_y, want_cls = vit_block_ops(x, cu, w, 4, **kwargs)
    module = types.ModuleType("raggedvit.kernels.block_engine")
    monkeypatch.setitem(sys.modules, "raggedvit.kernels.block_engine", None)  # missing: ImportError
    y, cls = vit_block_cuda(x, cu, w, 4, **kwargs)
    assert torch.equal(y, want_y) and torch.equal(cls, want_cls)

    def refuse(*args, **kw):
        raise TypeError("unsupported")

    module.vit_block_engine = refuse
    monkeypatch.setitem(sys.modules, "raggedvit.kernels.block_engine", module)
    y, cls = vit_block_cuda(x, cu, w, 4, **kwargs)
    assert torch.equal(y, want_y)
    seen = {}

    def engine(x_, cu_, w_, heads, *, eps, scale=None, return_cls_attn=False):
        seen.update(heads=heads, eps=eps, scale=scale)
        return (x_ + 1, x_.new_ones(x_.shape[0])) if return_cls_attn else x_ + 1

    module.vit_block_engine = engine
    y, cls = vit_block_cuda(x, cu, w, 4, **kwargs)
    assert torch.equal(y, x + 1) and seen == {"heads": 4, "eps": 1e-6, "scale": 0.25}
    y, none = vit_block_cuda(x, cu, w, 4, eps=1e-6, scale=0.25, return_cls_attn=False)
    assert torch.equal(y, x + 1) and none.shape == (0,)


def test_opcheck(gen: torch.Generator) -> None:
    """torch.library.opcheck: schema, fake kernel against the real one, dynamic-shape tracing."""
    w = _weights(_block(gen, C=16, heads=2), torch.float32, torch.float32)._replace(proj_bias=None, ls2=None)
    x, cu = _rows(gen, [4, 3], 2, 16, torch.float32)
    torch.library.opcheck(torch.ops.raggedvit.vit_block.default, (x, cu, *w, 2, 1e-6, 0.3, True))
