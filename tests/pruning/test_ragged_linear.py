"""PrunedViT(..., ragged_linear=True): the block GEMMs through raggedvit.kernels.ragged_linear (live rows only,
fused bias / GELU / residual) give the results of the default path, in both layouts; torch.compile traces it as one
graph; fallbacks per GEMM (LayerScale, fp16 recipe's float32 stream); families without the path refuse it."""

from __future__ import annotations

import pytest
import torch
from _eva_models import eva_model
from _pruning_models import get_images, get_model

import raggedvit.pruning.packed_block as packed_block
from raggedvit.pruning import PrunedViT, PruneSpec
from raggedvit.pruning.precision import apply_dtype

SPECS = [
    PruneSpec(),
    PruneSpec("topk-l2", prune_at=(1, 3), keep=0.6),
    PruneSpec("cls-mass", prune_at=(1, 3), mass=0.7),
    PruneSpec("evit", prune_at=(1, 2), keep=0.5, fuse=True),
]
PHOTOS = ("chelsea", "coffee", "rocket")


def _id(spec: PruneSpec) -> str:
    return spec.policy + ("-fuse" if spec.fuse else "")


def _pair(vit, spec: PruneSpec, images: torch.Tensor, **kwargs):
    with torch.no_grad():
        return PrunedViT(vit, spec, **kwargs)(images), PrunedViT(vit, spec, ragged_linear=True, **kwargs)(images)


def _check_same(ref, got, atol: float) -> None:
    assert float((got.logits - ref.logits).abs().max()) <= atol
    assert torch.equal(got.token_counts, ref.token_counts)
    for a, b, cu in zip(got.token_index, ref.token_index, ref.cu_seqlens):
        live = int(cu[-1])
        assert torch.equal(a[:live], b[:live])


class _Calls:
    """Counts the ragged linear calls of packed_block (the op sees every block GEMM on the ragged path)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[dict] = []
        original = packed_block.fused_linear

        def spy(x, weight, bias=None, residual=None, cu_seqlens=None, activation=0):
            self.calls.append({"bias": bias is not None, "residual": residual is not None, "act": activation})
            return original(x, weight, bias, residual, cu_seqlens, activation)

        monkeypatch.setattr(packed_block, "fused_linear", spy)


@pytest.mark.parametrize("capacity", [False, True], ids=["compact", "capacity"])
@pytest.mark.parametrize("spec", SPECS, ids=_id)
def test_equals_default_path(spec: PruneSpec, capacity: bool, monkeypatch) -> None:
    calls = _Calls(monkeypatch)
    images = get_images("deit_tiny_d4", PHOTOS)
    ref, got = _pair(get_model("deit_tiny_d4"), spec, images, capacity=capacity)
    _check_same(ref, got, 1e-5)
    # deit: every block fuses all four GEMMs: qkv (bias rides into attention), proj + x, fc1 + GELU, fc2 + x
    assert len(calls.calls) == 4 * 4
    assert calls.calls[:4] == [
        {"bias": False, "residual": False, "act": 0},
        {"bias": True, "residual": True, "act": 0},
        {"bias": True, "residual": False, "act": 1},
        {"bias": True, "residual": True, "act": 0},
    ]


def test_layer_scale_and_registers_fall_back_to_the_add(monkeypatch) -> None:
    """DINOv2 (LayerScale): proj and fc2 run the op with their bias, the residual add stays outside."""
    calls = _Calls(monkeypatch)
    spec = PruneSpec("cls-mass", prune_at=(1,), mass=0.7)
    ref, got = _pair(get_model("dinov2_reg4"), spec, get_images("dinov2_reg4"), capacity=True)
    _check_same(ref, got, 1e-5)
    assert calls.calls and not any(c["residual"] for c in calls.calls)


def test_fp16_recipe_keeps_float32_stream(monkeypatch) -> None:
    """The fp16 recipe (float32 stream, float16 GEMMs): no residual fusion across dtypes, same result as the
    default path up to fp16 rounding."""
    calls = _Calls(monkeypatch)
    vit = apply_dtype(get_model("deit_tiny_d3").float(), "fp16")
    spec = PruneSpec("topk-l2", prune_at=(1,), keep=0.5)
    ref, got = _pair(vit, spec, get_images("deit_tiny_d3", PHOTOS), capacity=True)
    assert float((got.logits - ref.logits).abs().max()) <= 5e-2 * float(ref.logits.abs().max())
    assert len(calls.calls) == 4 * 3 and not any(c["residual"] for c in calls.calls)


def test_torch_compile_fullgraph_capacity() -> None:
    spec = PruneSpec("cls-mass", prune_at=(1, 2), mass=0.7)
    images = get_images("deit_tiny_d3", PHOTOS)
    model = PrunedViT(get_model("deit_tiny_d3"), spec, capacity=True, ragged_linear=True)
    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(model)(images)
        assert explained.graph_count == 1 and explained.graph_break_count == 0
        torch._dynamo.reset()
        got = torch.compile(model, fullgraph=True, backend="aot_eager")(images)
        want = model(images)
    torch._dynamo.reset()
    assert float((got.logits - want.logits).abs().max()) <= 1e-6
    assert torch.equal(got.token_counts, want.token_counts)


def test_other_families_refuse() -> None:
    with pytest.raises(ValueError, match="ragged_linear=True needs a timm VisionTransformer; Eva runs as EvaBackbone"):
        PrunedViT(eva_model("eva02"), PruneSpec(), ragged_linear=True)
    PrunedViT(eva_model("eva02"), PruneSpec())  # the default stays available


@pytest.mark.parametrize("capacity", [False, True], ids=["compact", "capacity"])
@pytest.mark.parametrize("spec", SPECS, ids=_id)
def test_dead_rows_mode_follows_has_dead_rows(spec: PruneSpec, capacity: bool, monkeypatch) -> None:
    """ragged_linear="dead-rows" runs the op in exactly the blocks after the first data-dependent capacity stage;
    policies.has_dead_rows (what check_graph expects of an export) says whether there are any; same result."""
    from raggedvit.policies import has_dead_rows

    vit = get_model("deit_tiny_d4")
    model = PrunedViT(vit, spec, capacity=capacity, ragged_linear="dead-rows")
    flags: list[bool] = []
    block = model.backbone.block

    def spy(index, state, **kwargs):
        flags.append(bool(kwargs["ragged_linear"]))
        return block(index, state, **kwargs)

    monkeypatch.setattr(model.backbone, "block", spy)
    images = get_images("deit_tiny_d4", PHOTOS)
    with torch.no_grad():
        got = model(images)
        ref = PrunedViT(vit, spec, capacity=capacity)(images)
    _check_same(ref, got, 1e-5)
    first = min(spec.prune_at) if spec.prune_at else len(flags)
    dead = has_dead_rows(spec.policy, capacity)
    assert flags == [dead and i >= first for i in range(len(flags))]


@pytest.mark.parametrize("key", ["deit_tiny_d4", "deit_tiny_distilled", "deit_tiny_avg"])  # token / 2 rows / mean pool
def test_dead_rows_are_never_read(key: str, monkeypatch) -> None:
    """The op leaves its dead rows unspecified (the CUDA kernel never writes them): with NaN there after every
    ragged linear call (and in the GEMM's output buffer), the capacity layout's logits are unchanged."""
    original = packed_block.fused_linear
    poisoned = []

    def nan_dead_rows(x, weight, bias=None, residual=None, cu_seqlens=None, activation=0):
        y = original(x, weight, bias, residual, cu_seqlens, activation).clone()
        if cu_seqlens is not None and int(cu_seqlens[-1]) < y.shape[0]:
            y[int(cu_seqlens[-1]) :] = float("nan")
            poisoned.append(y.shape[0] - int(cu_seqlens[-1]))
        return y

    spec = PruneSpec("cls-mass", prune_at=(1, 3), mass=0.7)
    images = get_images(key, PHOTOS)
    with torch.no_grad():
        ref = PrunedViT(get_model(key), spec, capacity=True, ragged_linear="dead-rows")(images)
        monkeypatch.setattr(packed_block, "fused_linear", nan_dead_rows)
        got = PrunedViT(get_model(key), spec, capacity=True, ragged_linear="dead-rows")(images)
    assert poisoned, "no call had dead rows"
    assert torch.isfinite(got.logits).all()
    _check_same(ref, got, 0.0)
