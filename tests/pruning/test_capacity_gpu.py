"""The capacity layout on CUDA: torch.compile(mode="reduce-overhead") records a CUDA graph for cls-mass and
replays the eager result."""

from __future__ import annotations

import copy

import pytest
import torch
from _pruning_models import get_images, get_model

from raggedvit.pruning import PrunedViT, PruneSpec
from tests.support.testing import assert_close

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(autouse=True)
def _no_tf32():
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    with torch.no_grad():
        yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


@pytest.mark.parametrize(
    "spec", [PruneSpec("cls-mass", (4, 8), mass=0.8), PruneSpec("evit", (4, 8), keep=0.6, fuse=True)],
    ids=lambda s: s.policy + ("-fuse" if s.fuse else ""),
)  # fmt: skip
def test_reduce_overhead_records_a_cuda_graph(spec: PruneSpec) -> None:
    from torch._dynamo.utils import counters
    from torch._inductor import cudagraph_trees

    vit = copy.deepcopy(get_model("deit_tiny")).cuda()
    first = get_images("deit_tiny", ("chelsea", "coffee", "rocket", "astronaut")).cuda()
    second = first.flip(0).contiguous()
    model = PrunedViT(vit, spec, capacity=True)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    for images in (first, first, first, second, second):  # warm-up, record, replays; new data in the same graph
        got = compiled(images)
        want = model(images)
        assert torch.equal(got.token_counts, want.token_counts)
        assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-4, name="graph replay logits")
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    manager = cudagraph_trees.get_manager(first.device.index, create_if_none_exists=False)
    assert manager is not None
    recorded = [n for nodes in manager.roots.values() for n in nodes if isinstance(n, cudagraph_trees.CUDAGraphNode)]
    assert recorded, "no CUDA graph was recorded"
    compact = PrunedViT(vit, spec)(second)  # the capacity layout decides as the compact one
    assert torch.equal(compact.token_counts, got.token_counts)
    if spec.policy == "cls-mass":
        assert len(set(map(tuple, got.token_counts.tolist()))) > 1
    torch._dynamo.reset()


def test_triton_dead_rows_are_zero() -> None:
    """The Triton kernel on a capacity state: dead rows zero, live rows as without the tail (CUDA JIT kernels)."""
    from raggedvit.kernels import ragged_attention

    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(600, 3 * 3 * 64, generator=gen).half().cuda()
    cu = torch.tensor([0, 197, 250, 251, 300], dtype=torch.int32).cuda()  # rows 300..599 dead
    out, cls = ragged_attention(qkv, cu, 3, return_cls_attn=True)
    want, want_cls = ragged_attention(qkv[:300].contiguous(), cu, 3, return_cls_attn=True)
    torch.testing.assert_close(out[:300], want, rtol=0, atol=0)
    torch.testing.assert_close(cls[:300], want_cls, rtol=0, atol=0)
    assert (out[300:] == 0).all() and (cls[300:] == 0).all()
