"""tome on CUDA: PrunedViT with the Triton kernels' key bias (JIT) against the independent ToMe reference (and the
same body on the CPU, strict about devices), and the export on ONNX Runtime's CUDA EP (the AOT HAS_KEY_BIAS cubins)
against PrunedViT."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from _pruning_models import get_images, get_model

from raggedvit.pruning import PrunedViT, PruneSpec
from tests.support.devices import DEVICES, strict_device
from tests.support.testing import assert_close
from tests.support.tome_reference import tome_reference_forward

GPU = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

PHOTOS = ("chelsea", "coffee", "astronaut", "flower")


@pytest.fixture(autouse=True)
def _no_tf32():
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    with torch.no_grad():
        yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("model_key", ["deit_tiny", "deit_tiny_distilled", "dinov2_reg4"])
def test_fp32_equals_reference(model_key: str, device: str) -> None:
    """On CUDA (Triton kernels), and the same body on the CPU with tensors made without a device on "meta", so a
    helper that builds one on the wrong device fails in CPU CI too."""
    vit = copy.deepcopy(get_model(model_key)).to(device)
    # on the CPU, the photos of test_tome.py: dinov2_reg4 has a float32 similarity near-tie on the astronaut there
    images = get_images(model_key, PHOTOS if device == "cuda" else ("chelsea", "rocket")).to(device)
    with strict_device(device):
        out = PrunedViT(vit, PruneSpec("tome", r=8))(images)
        ref = tome_reference_forward(vit, images, 8)
    for s, index in enumerate(out.token_index):
        assert torch.equal(index.cpu().reshape(ref.token_index[s].shape), ref.token_index[s].cpu()), f"stage {s}"
    assert_close(out.logits, ref.logits, rtol=1e-4, atol=1e-4, name="cuda fp32 tome logits")


@pytest.mark.parametrize("dtype", ["fp32", "fp16-all"])
@GPU[0]
@GPU[1]
def test_cuda_ep_export_equals_prunedvit(dtype: str, tmp_path) -> None:
    import onnxruntime as ort

    from raggedvit.exporter import export_onnx
    from raggedvit.runtime import create_session

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("needs onnxruntime-gpu")
    vit, spec = get_model("deit_tiny_d3"), PruneSpec("tome", r=8)  # 3 blocks: every merge kind, a third the export
    images = get_images("deit_tiny_d3", PHOTOS)
    path = export_onnx(vit, spec, tmp_path / "tome.onnx", dtype=dtype)
    # every node on the CUDA EP; the batch fixed, so that ORT folds the shape arithmetic instead of moving it to the
    # CPU (the nodes' kernels: tests/exporter/test_placement.py)
    sess = create_session(str(path), "cuda", disable_cpu_fallback=True, batch=len(images))
    logits, counts = sess.run(["logits", "token_counts"], {"images": images.numpy()})
    ref = PrunedViT(vit, spec)(images)
    np.testing.assert_array_equal(counts, ref.token_counts.numpy())
    if dtype == "fp32":
        assert np.abs(logits - ref.logits.numpy()).max() < 1e-4
    else:  # fp16 keys may merge a near-tied pair the other way: the validator judges those; here the run and top-1
        assert np.isfinite(logits).all() and (logits.argmax(1) == ref.logits.numpy().argmax(1)).all()
