"""The capacity layout (DESIGN.md section 4): static row counts per stage, dead rows past cu[B], the same result
as the compact layout; torch.compile traces it as one graph for every policy."""

from __future__ import annotations

import pytest
import torch
from _pruning_models import get_images, get_model

from raggedvit.pruning import PackedState, PrunedViT, PruneSpec, capacity_prune_stage, packed_prune_stage
from raggedvit.pruning.packed import kept_token_index

SPECS = [
    PruneSpec(),
    PruneSpec("topk-l2", prune_at=(1, 3), keep=0.6),
    PruneSpec("evit", prune_at=(1, 3), keep=0.5),
    PruneSpec("evit", prune_at=(1, 2), keep=0.5, fuse=True),
    PruneSpec("cls-mass", prune_at=(1, 3), mass=0.7),
]
PHOTOS = ("chelsea", "coffee", "rocket", "astronaut")


def _id(spec: PruneSpec) -> str:
    return spec.policy + ("-fuse" if spec.fuse else "")


def _forward(key: str, spec: PruneSpec, images: torch.Tensor, **kwargs):
    with torch.no_grad():
        return PrunedViT(get_model(key), spec, **kwargs)(images)


@pytest.mark.parametrize("spec", SPECS, ids=_id)
@pytest.mark.parametrize("key", ["deit_tiny_d4", "deit_tiny_distilled"])
def test_capacity_equals_compact(key: str, spec: PruneSpec) -> None:
    images = get_images(key, PHOTOS)
    compact = _forward(key, spec, images)
    cap = _forward(key, spec, images, capacity=True)
    assert float((cap.logits - compact.logits).abs().max()) <= 1e-5  # fuse: the fused bmm's width differs
    assert torch.equal(cap.token_counts, compact.token_counts)
    B, N = images.shape[0], get_model(key).patch_embed.num_patches + get_model(key).num_prefix_tokens
    for s, (index, cu, ref_index, ref_cu) in enumerate(
        zip(cap.token_index, cap.cu_seqlens, compact.token_index, compact.cu_seqlens)
    ):
        live = int(cu[-1])
        assert torch.equal(cu, ref_cu) and torch.equal(index[:live], ref_index)
        a, b = cap.stages[s], compact.stages[s]
        assert torch.equal(a.n, b.n) and torch.equal(a.k, b.k) and torch.equal(a.kept, b.kept)
        if spec.policy == "cls-mass":  # capacity B x N rows, some of them dead
            assert index.shape[0] == B * N and live < B * N
        else:  # counts known before the data: no dead rows (evit with fuse: capacity B x (p + k + 1))
            assert index.shape[0] == live
    for out in (compact, cap):  # the stages' src alone give the kept tokens (what the validator reads of an export)
        index = kept_token_index([t.src for t in out.stages], B, N, spec.fuse)
        assert all(torch.equal(a, b) for a, b in zip(index, out.token_index)) and len(index) == len(out.token_index)
    if spec.policy == "cls-mass":
        assert len(set(map(tuple, compact.token_counts.tolist()))) > 1, "needs different counts per image"


@pytest.mark.parametrize("spec", [SPECS[-1]], ids=_id)
def test_capacity_with_registers(spec: PruneSpec) -> None:
    images = get_images("dinov2_reg4")
    compact = _forward("dinov2_reg4", spec, images)
    cap = _forward("dinov2_reg4", spec, images, capacity=True)
    assert float((cap.logits - compact.logits).abs().max()) <= 1e-5
    assert torch.equal(cap.token_counts, compact.token_counts)


@pytest.mark.parametrize(
    "spec", [PruneSpec("cls-mass", prune_at=(1,), mass=0.6), PruneSpec("evit", (1,), keep=0.4, fuse=True)], ids=_id
)
def test_capacity_stage_ignores_dead_input_rows(spec: PruneSpec) -> None:
    """A state with dead rows (NaN) past cu[B]: the stage reads only live rows; its live output equals the compact
    stage's on the live rows, and its dead rows are finite copies with in-range indices."""
    gen = torch.Generator().manual_seed(0)
    counts, width, p, C = [5, 3, 8], 8, 1, 4
    live = sum(counts)
    T = len(counts) * width  # capacity 24, rows 16..23 dead
    cu = torch.tensor([0, 5, 8, 16])
    seq_id = torch.repeat_interleave(torch.arange(3), torch.tensor(counts))
    pos = torch.cat([torch.arange(n) for n in counts])
    x = torch.randn(live, C, generator=gen)
    scores = torch.rand(live, generator=gen)
    compact = PackedState(x, cu, seq_id, pos, pos.clone())
    pad = torch.full((T - live,), -5, dtype=torch.int64)
    dead = PackedState(
        torch.cat((x, torch.full((T - live, C), float("nan")))),
        cu,
        torch.cat((seq_id, pad)),
        torch.cat((pos, pad)),
        torch.cat((pos, pad)),
    )
    dead_scores = torch.cat((scores, torch.full((T - live,), float("nan"))))
    want, want_trace = packed_prune_stage(compact, scores, scores, width, p, spec)
    bound = width + int(spec.fuse)
    got, trace = capacity_prune_stage(dead, dead_scores, dead_scores, width, bound, p, spec)
    n = int(got.cu[-1])
    assert got.x.shape == (3 * bound, C) and n < 3 * bound
    assert torch.equal(got.cu, want.cu) and torch.equal(trace.kept, want_trace.kept)
    assert torch.equal(got.x[:n], want.x) and torch.equal(got.seq_id[:n], want.seq_id)
    assert torch.equal(got.pos[:n], want.pos) and torch.equal(got.token_index[:n], want.token_index)
    assert torch.isfinite(got.x).all()
    assert ((got.seq_id >= 0) & (got.seq_id < 3)).all() and (got.pos >= 0).all()
    assert (got.token_index >= -1).all() and (got.token_index < width).all()


@pytest.mark.parametrize("spec", SPECS, ids=_id)
def test_torch_compile_fullgraph_every_policy(spec: PruneSpec) -> None:
    """One graph, no graph break, no dynamo config needed (aot_eager: the trace, without inductor's codegen)."""
    images = get_images("deit_tiny_d3", PHOTOS)
    spec = PruneSpec.from_dict({**spec.to_dict(), "prune_at": [i for i in spec.prune_at if i < 3][:2]})
    model = PrunedViT(get_model("deit_tiny_d3"), spec, capacity=True)
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(model, fullgraph=True, backend="aot_eager")(images)
        want = model(images)
    torch._dynamo.reset()
    assert float((got.logits - want.logits).abs().max()) <= 1e-6
    assert torch.equal(got.token_counts, want.token_counts)


def test_torch_compile_inductor_cls_mass() -> None:
    """Inductor (CPU) of the data-dependent policy: fullgraph, equal to eager."""
    spec = PruneSpec("cls-mass", prune_at=(1, 2), mass=0.7)
    images = get_images("deit_tiny_d3", PHOTOS)
    model = PrunedViT(get_model("deit_tiny_d3"), spec, capacity=True)
    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(model)(images)
        assert explained.graph_count == 1 and explained.graph_break_count == 0
        torch._dynamo.reset()
        got = torch.compile(model, fullgraph=True)(images)
        want = model(images)
    torch._dynamo.reset()
    assert float((got.logits - want.logits).abs().max()) <= 1e-5
    assert torch.equal(got.token_counts, want.token_counts)
    assert len(set(map(tuple, want.token_counts.tolist()))) > 1
