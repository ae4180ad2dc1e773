"""The fp16 graph's own arithmetic, evaluated with onnx.reference (RaggedAttention / BiasGelu in Python).

ORT 1.32's CPU EP cannot load the fp16 graph with the current op library (the custom op's output type is
inferred as float), so numerics are checked here without ORT; the CUDA EP runs fp16 in the GPU tests.
"""

from __future__ import annotations

import numpy as np
import torch

from raggedvit.exporter import build_model
from raggedvit.pruning import PrunedViT, PruneSpec
from raggedvit.weights import load_vit

from .refeval import reference_evaluator


def test_fp16_graph_close_to_fp32_reference(images):
    vit, _ = load_vit("deit_tiny_patch16_224", seed=0, model_kwargs={"depth": 4})
    spec = PruneSpec("evit", (2,), fuse=True)
    model = build_model(vit, spec, dtype="fp16")
    x = images[:2]
    logits, counts = reference_evaluator(model).run(None, {"images": x.numpy()})
    with torch.no_grad():
        ref = PrunedViT(vit, spec)(x)
    assert logits.dtype == np.float32
    np.testing.assert_array_equal(counts, ref.token_counts.numpy())
    scale = float(ref.logits.abs().max())
    assert np.abs(logits - ref.logits.numpy()).max() < 2e-2 * scale
