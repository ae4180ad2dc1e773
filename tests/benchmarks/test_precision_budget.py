"""benchmarks.precision_budget: the float64 emulator is the pruned forward, and fp16 rounding shows up in it."""

from __future__ import annotations

import torch

from benchmarks.precision_budget import CONFIGS, Emulator
from raggedvit.pruning import PrunedViT, PruneSpec
from raggedvit.weights import load_vit
from tests.support.testing import assert_close


def test_exact_emulation_is_the_pruned_forward_and_rounding_moves_it():
    vit, _ = load_vit("deit_tiny_patch16_224", seed=0, model_kwargs={"depth": 6})
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = PrunedViT(vit, PruneSpec("topk-l2", (4,), keep=0.5))(x)
        emu = Emulator(vit)
        for i in range(2):
            logits, kept = emu.forward(x[i].double(), (frozenset(), "", False, False))
            cu = out.cu_seqlens[0]
            assert kept.tolist() == sorted(out.token_index[0][cu[i] : cu[i + 1]].tolist())
            assert_close(logits.float(), out.logits[i], rtol=1e-4, name=f"image {i} logits")
            rounded, _ = emu.forward(x[i].double(), CONFIGS["fp16-all (fp16 stream)"], kept)
            d = float((rounded - logits).abs().max())
            assert 1e-5 < d < 5e-2, d
