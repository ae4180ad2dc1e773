"""The packed pruned ViT on CUDA (Triton ragged attention) against the padded reference; the reference comparison's
body also runs on the CPU with a strict default device (tests/support/devices.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from _pruning_models import get_images, get_model

from raggedvit.pruning import PrunedViT, PruneSpec
from tests.support.devices import DEVICES, strict_device
from tests.support.padded import padded_reference_forward
from tests.support.testing import assert_close

GPU = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SPECS = [
    PruneSpec("topk-l2", prune_at=(3, 6, 9), keep=0.7),
    PruneSpec("evit", prune_at=(4,), keep=0.5, fuse=True),
    PruneSpec("cls-mass", prune_at=(4, 8), mass=0.8),
]


def _cuda_model(key: str) -> torch.nn.Module:
    return copy.deepcopy(get_model(key)).cuda()  # the cached CPU model stays on the CPU


@pytest.fixture(autouse=True)
def _no_tf32():
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    with torch.no_grad():
        yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.policy + ("-fuse" if s.fuse else ""))
def test_fp32_matches_padded_reference(spec: PruneSpec, device: str) -> None:
    vit = copy.deepcopy(get_model("deit_tiny")).to(device)  # the cached CPU model stays as it is
    images = get_images("deit_tiny", ("chelsea", "coffee", "rocket", "astronaut")).to(device)
    with strict_device(device):
        packed = PrunedViT(vit, spec)(images)
        padded = padded_reference_forward(vit, spec, images)
    assert torch.equal(packed.token_counts.cpu(), padded.token_counts.cpu())
    assert_close(packed.logits, padded.logits, rtol=1e-4, atol=1e-4, name="cuda fp32 logits")


@GPU[0]
@GPU[1]
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_cuda_half_runs_and_tracks_fp32(dtype: torch.dtype) -> None:
    spec = PruneSpec("topk-l2", prune_at=(3, 6, 9), keep=0.7)  # counts fixed by keep, not by scores
    vit = _cuda_model("deit_tiny")
    images = get_images("deit_tiny", ("chelsea", "coffee", "rocket", "astronaut")).cuda()
    ref = PrunedViT(vit, spec)(images)
    half = PrunedViT(copy.deepcopy(vit).to(dtype), spec)(images.to(dtype))
    assert half.logits.dtype == dtype and bool(torch.isfinite(half.logits).all())
    assert torch.equal(half.token_counts, ref.token_counts)
    # selections may differ on near-ties in half precision; the logits stay close anyway
    rel = float((half.logits.float() - ref.logits).norm() / ref.logits.norm())
    assert rel < 5e-2, rel


@GPU[0]
@GPU[1]
def test_cuda_export_runs() -> None:
    vit = _cuda_model("deit_tiny_d4")
    spec = PruneSpec("cls-mass", prune_at=(1, 3), mass=0.7)
    model = PrunedViT(vit, spec).eval()
    first = get_images("deit_tiny_d4", ("chelsea", "coffee")).cuda()
    second = get_images("deit_tiny_d4", ("rocket", "astronaut")).cuda()
    run = torch.export.export(model, (first,)).module()
    for images in (first, second):
        got, want = run(images), model(images)
        assert torch.equal(got.token_counts, want.token_counts)
        assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-4, name="exported cuda logits")
