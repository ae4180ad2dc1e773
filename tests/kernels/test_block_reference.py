"""vit_block_reference (the block engine's semantics) against timm's Block on each packed sequence."""

from __future__ import annotations

import pytest
import torch
from timm.models.vision_transformer import Block

from raggedvit.kernels.reference import BlockWeights, vit_block_reference
from raggedvit.pruning.packed_block import block_weights as packed_block_weights


def block_weights(block: Block) -> BlockWeights:
    w = packed_block_weights(block, torch.float32)
    assert w is not None
    return w


@pytest.mark.parametrize("init_values", [None, 0.5])
def test_reference_matches_timm_block(gen: torch.Generator, init_values: float | None) -> None:
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    block = Block(64, 4, qkv_bias=True, init_values=init_values).eval()
    lengths = [7, 1, 12]
    T = sum(lengths) + 3  # three dead rows
    x = torch.randn(T, 64, generator=gen)
    cu = torch.tensor([0, 7, 8, 20])
    y, cls = vit_block_reference(x, cu, block_weights(block), 4, eps=block.norm1.eps, return_cls_attn=True)
    gold = vit_block_reference(x, cu, block_weights(block), 4, eps=block.norm1.eps, compute_dtype=torch.float64)
    with torch.no_grad():
        for start, end in zip(cu[:-1].tolist(), cu[1:].tolist()):
            want = block(x[None, start:end].double().to(torch.float32))[0]
            torch.testing.assert_close(y[start:end], want, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(gold[start:end].float(), want, rtol=1e-5, atol=1e-5)
            assert torch.isclose(cls[start:end].sum(), torch.tensor(1.0))
    assert torch.equal(y[20:], torch.zeros(3, 64)) and torch.equal(cls[20:], torch.zeros(3))
