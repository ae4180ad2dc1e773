"""Random ragged batches and the checks shared by the kernel tests."""

from __future__ import annotations

import torch

from raggedvit.kernels.reference import pos_table_size, ragged_attention_reference
from tests.support.testing import assert_close

LENGTHS = (1, 2, 63, 64, 65, 197, 577)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def random_lengths(
    gen: torch.Generator, max_batch: int, max_tokens: int, choices: tuple[int, ...] = LENGTHS
) -> list[int]:
    """1..max_batch lengths drawn from `choices`, stopping before the total exceeds max_tokens (at least one)."""
    batch = int(torch.randint(1, max_batch + 1, (1,), generator=gen))
    picks = torch.randint(0, len(choices), (batch,), generator=gen).tolist()
    lengths: list[int] = []
    for i in picks:
        if lengths and sum(lengths) + choices[i] > max_tokens:
            continue
        lengths.append(choices[i])
    return lengths


def make_batch(
    lengths: list[int],
    num_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    gen: torch.Generator,
    *,
    cu_dtype: torch.dtype = torch.int32,
    device: str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """qkv [T, 3*H*D] standard normal in `dtype`, cu_seqlens [B+1]."""
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    cu[1:] = torch.tensor(lengths, dtype=torch.int64).cumsum(0)
    T = int(cu[-1])
    qkv = torch.randn(T, 3 * num_heads * head_dim, generator=gen).to(dtype)
    return qkv.to(device), cu.to(cu_dtype).to(device)


def poisoned_outputs(qkv: torch.Tensor, num_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """NaN-filled out [T, H*D] and cls_attn [T] fp32, so unwritten elements fail the checks."""
    T, width = qkv.shape
    out = torch.full((T, width // 3), float("nan"), dtype=qkv.dtype, device=qkv.device)
    cls_attn = torch.full((T,), float("nan"), dtype=torch.float32, device=qkv.device)
    return out, cls_attn


def reference(
    qkv: torch.Tensor, cu: torch.Tensor, num_heads: int, scale: float | None = None, **pos
) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 reference (out [T, H*D], cls_attn [T]) computed on qkv's device (pos: relative position kwargs)."""
    return ragged_attention_reference(
        qkv, cu, num_heads, scale=scale, return_cls_attn=True, compute_dtype=torch.float64, **pos
    )


def relpos_inputs(
    lengths: list[int],
    num_heads: int,
    grid: tuple[int, int],
    num_prefix: int,
    gen: torch.Generator,
    *,
    cu_dtype: torch.dtype = torch.int32,
    odd_rows: int = 0,
    device: str = "cpu",
) -> dict:
    """Relative position kwargs for packed sequences of `lengths`: pos_table [H, R] fp32 (scale ~2, so the bias
    matters), token_pos [T] (each sequence: its prefix tokens, then distinct patch indices in random order, as
    after pruning; sequences longer than p + grid area repeat patches), grid, num_prefix. `odd_rows` rows get
    values that are class rows by the contract: -1 (a fused token), a prefix index, p + area, huge ones."""
    area = grid[0] * grid[1]
    table = torch.randn(num_heads, pos_table_size(grid), generator=gen) * 2
    rows = []
    for n in lengths:
        patches = torch.randperm(area, generator=gen).repeat(n // max(area, 1) + 1)[: max(n - num_prefix, 0)]
        rows.append(torch.cat([torch.arange(min(n, num_prefix)), patches + num_prefix]))
    token_pos = torch.cat(rows) if rows else torch.zeros(0, dtype=torch.int64)
    info = torch.iinfo(cu_dtype)
    odd = [-1, num_prefix + area, info.max, info.min, -(2**20), 2**20, 0]
    for i in range(min(odd_rows, token_pos.numel())):
        j = int(torch.randint(0, token_pos.numel(), (1,), generator=gen))
        token_pos[j] = odd[i % len(odd)]
    return {
        "pos_table": table.to(device),
        "token_pos": token_pos.to(cu_dtype).to(device),
        "grid": grid,
        "num_prefix": num_prefix,
    }


def check_against_reference(
    out: torch.Tensor,
    cls_attn: torch.Tensor | None,
    qkv: torch.Tensor,
    cu: torch.Tensor,
    num_heads: int,
    *,
    scale: float | None = None,
    name: str = "",
    ref: tuple[torch.Tensor, torch.Tensor] | None = None,
    pos: dict | None = None,
) -> None:
    """out (and cls_attn) vs the float64 reference (`ref` if precomputed; `pos`: relative position kwargs);
    cls_attn sums to 1 per sequence."""
    ref_out, ref_cls = reference(qkv, cu, num_heads, scale, **(pos or {})) if ref is None else ref
    assert out.dtype == qkv.dtype
    assert_close(out.cpu(), ref_out.to(qkv.dtype), name=f"{name} out")
    if cls_attn is None:
        return
    assert cls_attn.dtype == torch.float32
    assert_close(cls_attn.cpu(), ref_cls.to(torch.float32), name=f"{name} cls_attn")
    bounds = cu.cpu().tolist()
    sums = torch.stack([cls_attn.cpu()[a:b].double().sum() for a, b in zip(bounds[:-1], bounds[1:]) if b > a])
    assert_close(sums.float(), torch.ones_like(sums).float(), name=f"{name} cls_attn sums")
