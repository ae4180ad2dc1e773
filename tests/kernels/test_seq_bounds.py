"""`_seq_bounds` (coarse + chunked vector search of cu_seqlens) under the interpreter with tiny chunks."""

from __future__ import annotations

import pytest
import torch


def _bounds(interpreted, cu: torch.Tensor, T: int, block: int, chunk: int, coarse: int):
    start = torch.full((T,), -1, dtype=torch.int32)
    end = torch.full((T,), -1, dtype=torch.int32)
    grid = (-(-T // block),)
    interpreted._seq_bounds_probe[grid](cu, start, end, T, cu.numel() - 1, BLOCK=block, CHUNK=chunk, COARSE=coarse)
    return start, end


@pytest.mark.parametrize(("block", "chunk", "coarse"), [(4, 2, 2), (8, 4, 2), (16, 8, 4), (4, 64, 64)])
@pytest.mark.parametrize("cu_dtype", [torch.int32, torch.int64])
def test_matches_searchsorted(interpreted, gen, block, chunk, coarse, cu_dtype):
    """Many short and empty sequences: several coarse blocks and chunks per tile."""
    B = int(torch.randint(1, 90, (1,), generator=gen))
    lengths = torch.randint(0, 4, (B,), generator=gen)
    lengths[0] = max(int(lengths[0]), 1)
    cu = torch.zeros(B + 1, dtype=torch.int64)
    cu[1:] = lengths.cumsum(0)
    T = int(cu[-1])
    start, end = _bounds(interpreted, cu.to(cu_dtype), T, block, chunk, coarse)
    b = torch.searchsorted(cu, torch.arange(T), right=True) - 1  # largest b with cu[b] <= row
    assert torch.equal(start.long(), cu[b]), f"lengths={lengths.tolist()}"
    assert torch.equal(end.long(), cu[b + 1]), f"lengths={lengths.tolist()}"


def test_bad_cu_in_range(interpreted):
    cu = torch.tensor([0, 9, 3, 50, -4, 7, 7, 2], dtype=torch.int32)
    start, end = _bounds(interpreted, cu, 12, 4, 2, 2)
    assert ((start >= 0) & (start <= 12) & (end >= 0) & (end <= 12)).all()
