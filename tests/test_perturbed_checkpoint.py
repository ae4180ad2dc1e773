"""tests/support/perturbed_checkpoint.py: the checkpoint loads back exactly and has nonzero biases and norm shifts."""

from __future__ import annotations

import torch

from raggedvit.weights import load_vit
from tests.support.perturbed_checkpoint import write_checkpoint


def test_checkpoint_round_trip(tmp_path):
    path = tmp_path / "tiny.safetensors"
    sha = write_checkpoint("deit_tiny_patch16_224", path, seed=3)
    vit, info = load_vit("deit_tiny_patch16_224", checkpoint=path)
    assert info.source == "checkpoint" and info.checkpoint_sha256 == sha and info.sharpen_qk == 1.0
    want, _ = load_vit("deit_tiny_patch16_224", seed=3)  # sharpened q/k, zero biases
    blk, ref = vit.blocks[0], want.blocks[0]
    assert torch.equal(blk.attn.qkv.weight, ref.attn.qkv.weight)  # the sharpening is baked in, not redone
    assert float(blk.attn.qkv.bias.detach().abs().max()) > 0.05 and float(ref.attn.qkv.bias.detach().abs().max()) == 0
    assert not torch.equal(blk.norm1.weight, ref.norm1.weight)
