"""BEiT and VisionTransformerRelPos on CUDA: PrunedViT with the Triton kernels' relative position bias equals the
CPU forward and timm's own masked dense forward; the fp32 export on ORT's CUDA EP equals PrunedViT."""

from __future__ import annotations

import pytest
import torch
from _relpos_models import IMG, MODELS, WITH_CLASS_TOKEN, build, masked_dense_forward

from raggedvit.pruning import PrunedViT, PruneSpec
from tests.support.testing import assert_close

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

WIDE = {"embed_dim": 128}  # head dim 32: the AOT kernels ship D % 16 == 0 in 32..128


@pytest.fixture(autouse=True)
def _no_tf32():
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    with torch.no_grad():
        yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def _images() -> torch.Tensor:
    return torch.randn(3, 3, *IMG, generator=torch.Generator().manual_seed(3))


TOPK, EVIT_FUSE = PruneSpec("topk-l2", (1,)), PruneSpec("evit", (1,), keep=0.5, fuse=True)
CASES = [(name, TOPK) for name in MODELS] + [(name, EVIT_FUSE) for name in WITH_CLASS_TOKEN]


@pytest.mark.parametrize("name,spec", CASES, ids=[f"{n}-{s.policy}" for n, s in CASES])
def test_cuda_equals_cpu_and_timm(name, spec):
    """Triton (HAS_POS) vs the CPU path; topk-l2 also vs timm's masked dense forward on the GPU (the evit fused
    token, token_pos -1, is not a token of timm's forward)."""
    model, x = build(name, **WIDE), _images()
    cpu = PrunedViT(model, spec)(x)
    gpu = PrunedViT(model.cuda(), spec)(x.cuda())
    assert torch.equal(gpu.token_counts.cpu(), cpu.token_counts)
    assert_close(gpu.logits.cpu(), cpu.logits, rtol=1e-4, name=f"{name} cuda vs cpu")
    assert_close(PrunedViT(model, PruneSpec())(x.cuda()).logits, model(x.cuda()), rtol=1e-4, name=f"{name} none")
    if spec.fuse:
        return
    index, cu = gpu.token_index[0].cpu(), gpu.cu_seqlens[0].cpu()
    image = torch.repeat_interleave(torch.arange(x.shape[0]), cu[1:] - cu[:-1])
    keep = torch.zeros(x.shape[0], model.patch_embed.num_patches + model.num_prefix_tokens, dtype=torch.bool)
    keep[image, index] = True
    dense = masked_dense_forward(model, x.cuda(), keep.cuda(), at=1)
    assert_close(gpu.logits, dense, rtol=1e-4, name=f"{name} cuda vs timm masked")


@pytest.mark.parametrize("name", ["beit-shared-abs-token", "relpos-swin-cls", "srelpos-bias-qknorm"])
def test_ort_cuda_export_equals_pruned_vit(name, tmp_path):
    import numpy as np

    from raggedvit.exporter import export_onnx
    from raggedvit.runtime import create_session

    model, x = build(name, **WIDE), _images()
    spec = EVIT_FUSE if name in WITH_CLASS_TOKEN else TOPK
    path = export_onnx(model, spec, tmp_path / "m.onnx")
    logits, counts = create_session(path, "cuda").run(None, {"images": x.numpy()})[:2]
    ref = PrunedViT(model, spec)(x)
    np.testing.assert_array_equal(counts, ref.token_counts.numpy())
    scale = float(ref.logits.abs().max())
    assert float(np.abs(logits - ref.logits.numpy()).max()) <= 1e-3 * scale  # TF32 off for fp32 exports
