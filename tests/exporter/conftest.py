"""Shared fixtures: seeded DeiT-Tiny (load_vit(seed=0)), real sample images, an ORT session factory."""

from __future__ import annotations

import pytest
import torch

from raggedvit.images import preprocess, sample_images
from raggedvit.weights import load_vit


@pytest.fixture(scope="session")
def deit_tiny():
    vit, _ = load_vit("deit_tiny_patch16_224", seed=0)
    return vit


@pytest.fixture(scope="session")
def images(deit_tiny) -> torch.Tensor:
    """[N, 3, 224, 224] float32 sample photos (N >= 5), preprocessed for DeiT-Tiny."""
    pairs = sample_images()
    assert len(pairs) >= 5, "needs the sample photos of scikit-image / scikit-learn / matplotlib"
    return preprocess(pairs, deit_tiny)


@pytest.fixture(scope="session")
def ort_session():
    """session(model_path_or_proto) -> onnxruntime.InferenceSession on the CPU EP with the op library."""
    import onnxruntime as ort

    from raggedvit.custom_ops import library_path

    lib = library_path()  # raises OpLibraryNotBuilt with the build command

    def make(model):
        opts = ort.SessionOptions()
        opts.register_custom_ops_library(lib)
        data = model if isinstance(model, str) else to_proto(model).SerializeToString()
        return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])

    return make


def to_proto(model):
    """onnx.ModelProto of an exporter result (onnx_ir Model) or a proto."""
    import onnx_ir as ir

    return ir.to_proto(model) if isinstance(model, ir.Model) else model


@pytest.fixture(scope="session")
def deit_tiny_d6():
    """Seeded DeiT-Tiny with 6 blocks, random biases / norm shifts / tokens (every bias path is exercised)."""
    from raggedvit.weights import perturb_biases_and_norms_

    vit, _ = load_vit("deit_tiny_patch16_224", seed=1, model_kwargs={"depth": 6})
    return perturb_biases_and_norms_(vit)
