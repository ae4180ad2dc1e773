"""Patch embedding: the patchify MatMul (and the Conv kept for overlapping patches) match timm's Conv2d."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto
from torch import nn

from raggedvit.exporter._builder import GraphBuilder
from raggedvit.exporter.embed import patch_embed
from raggedvit.testing import assert_close


class _PatchEmbed(nn.Module):
    def __init__(self, size: int, kernel: int, stride: int, cin: int = 3, dim: int = 24, bias: bool = True):
        super().__init__()
        self.proj = nn.Conv2d(cin, dim, kernel, stride=stride, bias=bias)
        self.img_size = (size, size)
        g = (size - kernel) // stride + 1
        self.grid_size = (g, g)


def _run(pe: _PatchEmbed, x: torch.Tensor) -> tuple[np.ndarray, bool]:
    g = GraphBuilder()
    images = g.add_input("images", TensorProto.FLOAT, ["batch", x.shape[1], *pe.img_size])
    out, bias_left = patch_embed(g, pe, images)
    g.add_output(out, TensorProto.FLOAT, ["batch", "patches", pe.proj.out_channels])
    model = g.build("pe", {"": 17})
    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"images": x.numpy()})[0], bias_left


@pytest.mark.parametrize("kernel,stride,bias", [(4, 4, True), (4, 4, False), (5, 3, True)])
def test_patch_embed_matches_conv(kernel, stride, bias):
    torch.manual_seed(0)
    pe = _PatchEmbed(size=20 if kernel == stride else 17, kernel=kernel, stride=stride, bias=bias).eval()
    x = torch.randn(2, 3, *pe.img_size)
    with torch.no_grad():
        want = pe.proj(x).flatten(2).transpose(1, 2)  # [B, N, C] with the bias
    got, bias_left = _run(pe, x)
    # non-overlapping patches: one MatMul, bias left to the caller (folded into pos_embed); else the Conv adds it
    assert bias_left == (bias and kernel == stride)
    if bias_left:
        want = want - pe.proj.bias
    assert_close(torch.from_numpy(got), want, rtol=1e-5, name="patch embeddings")
