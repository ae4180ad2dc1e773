"""The CUDA (Triton) path vs the float64 reference: dtypes, head dims, heads, fast launch, graphs, compile.

Run on the GPU machine: python -m pytest tests/kernels -m gpu
"""

from __future__ import annotations

import pytest
import torch
from _kernel_cases import DTYPES, check_against_reference, make_batch, poisoned_outputs, random_lengths, reference

from raggedvit.kernels import ragged_attention
from raggedvit.kernels._launch import _FAST, _launch_triton

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("D", [32, 64, 80, 128])
@pytest.mark.parametrize("H", [1, 3, 12])
def test_random_batches(gen, dtype, D, H):
    lengths = random_lengths(gen, 64, 20000)
    cu_dtype = torch.int32 if int(torch.randint(0, 2, (1,), generator=gen)) else torch.int64
    qkv, cu = make_batch(lengths, H, D, dtype, gen, cu_dtype=cu_dtype, device="cuda")
    ref = reference(qkv, cu, H)
    out, cls_attn = poisoned_outputs(qkv, H)
    _launch_triton(qkv, cu, H, D**-0.5, True, out=out, cls_attn=cls_attn)
    check_against_reference(out, cls_attn, qkv, cu, H, name=f"lengths={lengths}", ref=ref)
    for i in range(2):  # the second call takes the cached fast launch
        out, cls_attn = ragged_attention(qkv, cu, H, return_cls_attn=True)
        check_against_reference(out, cls_attn, qkv, cu, H, name=f"call {i} lengths={lengths}", ref=ref)
        check_against_reference(ragged_attention(qkv, cu, H), None, qkv, cu, H, name=f"call {i} no cls", ref=ref)


@pytest.mark.parametrize("D", [8, 16, 200, 256])
def test_other_head_dims(gen, D):
    qkv, cu = make_batch([1, 65, 197, 2], 2, D, torch.float16, gen, device="cuda")
    out, cls_attn = ragged_attention(qkv, cu, 2, return_cls_attn=True)
    check_against_reference(out, cls_attn, qkv, cu, 2)


def test_fast_launch_is_used_and_matches(gen):
    qkv, cu = make_batch([197, 33, 64], 12, 64, torch.float16, gen, device="cuda")
    ragged_attention(qkv, cu, 12, return_cls_attn=True)
    assert any(k[1] == torch.float16 and k[3:6] == (12, 64, 1) for k in _FAST), "no cached fast launch entry"
    qkv2, cu2 = make_batch([5, 300, 1], 12, 64, torch.float16, gen, device="cuda")  # new T and B, same kernel
    out, cls_attn = ragged_attention(qkv2, cu2, 12, return_cls_attn=True)
    check_against_reference(out, cls_attn, qkv2, cu2, 12)


def test_unaligned_and_strided_inputs(gen):
    qkv, cu = make_batch([7, 50], 3, 64, torch.float16, gen, device="cuda")
    flat = torch.empty(qkv.numel() + 1, dtype=qkv.dtype, device="cuda")
    shifted = flat[1:].view_as(qkv)  # data_ptr not 16-byte aligned
    shifted.copy_(qkv)
    check_against_reference(ragged_attention(shifted, cu, 3), None, qkv, cu, 3, name="unaligned")
    wide = torch.zeros(qkv.shape[0], qkv.shape[1] + 8, dtype=qkv.dtype, device="cuda")
    wide[:, : qkv.shape[1]] = qkv
    check_against_reference(ragged_attention(wide[:, : qkv.shape[1]], cu, 3), None, qkv, cu, 3, name="strided")


def test_bad_cu_does_not_fault(gen):
    qkv, cu = make_batch([64], 2, 32, torch.float16, gen, device="cuda")
    for values in ([0, 40, 20, 64], [0, 1000], [-5, 3, 64], [0, 10]):
        ragged_attention(qkv, torch.tensor(values, device="cuda", dtype=torch.int32), 2, return_cls_attn=True)
    torch.cuda.synchronize()


def test_empty_and_single(gen):
    empty = torch.empty(0, 3 * 2 * 32, dtype=torch.float16, device="cuda")
    out, cls_attn = ragged_attention(empty, torch.zeros(1, dtype=torch.int32, device="cuda"), 2, return_cls_attn=True)
    assert out.shape == (0, 64) and cls_attn.shape == (0,)
    qkv, cu = make_batch([1], 2, 32, torch.float32, gen, device="cuda")
    out, cls_attn = ragged_attention(qkv, cu, 2, return_cls_attn=True)
    torch.testing.assert_close(out, qkv[:, 128:])
    torch.testing.assert_close(cls_attn, torch.ones(1, device="cuda"))


def test_cuda_graph_capture(gen):
    qkv, cu = make_batch([197, 99, 40], 12, 64, torch.float16, gen, device="cuda")
    ragged_attention(qkv, cu, 12, return_cls_attn=True)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, cls_attn = ragged_attention(qkv, cu, 12, return_cls_attn=True)
    qkv.copy_(torch.randn(qkv.shape, generator=gen).to(qkv))
    graph.replay()
    torch.cuda.synchronize()
    check_against_reference(out, cls_attn, qkv, cu, 12)


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(64, 3 * 64)

    def forward(self, x: torch.Tensor, cu: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return ragged_attention(self.qkv(x), cu, 4, return_cls_attn=True)


def test_torch_compile_fullgraph(gen):
    model = _Block().cuda().half()
    x = torch.randn(120, 64, generator=gen).cuda().half()
    cu = torch.tensor([0, 20, 120], device="cuda")
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        out, cls_attn = compiled(x, cu)
        ref_out, ref_cls = model(x, cu)
    torch.testing.assert_close(out, ref_out, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(cls_attn, ref_cls)


def test_export_on_gpu(gen):
    model = _Block().cuda().half()
    x = torch.randn(50, 64, generator=gen).cuda().half()
    cu = torch.tensor([0, 10, 50], device="cuda")
    ep = torch.export.export(model, (x, cu))
    assert torch.ops.raggedvit.ragged_attention.default in [n.target for n in ep.graph.nodes]
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(x, cu)[0], model(x, cu)[0])
