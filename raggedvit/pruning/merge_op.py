"""`torch.ops.raggedvit.merge_tokens`: one tome stage's merge (matching and size-weighted sums) as one op.

Schema: (x [T, C], qkv [T, 3*H*Dh], qkv_bias [3*H*Dh]?, size [T] float32?, cu [B+1] int64, num_heads, num_prefix, r,
class_token) -> (x' [B*m, C], size' [B*m] float32, cu' [B+1] int64, src [B*m] int64, key_bias [B*m] float32,
score [B*n_A] float32): `merge.MergedRows`.
CPU: `merge.merge_tokens_reference` (the one definition). CUDA: the Triton kernel of
`raggedvit/kernels/_merge_kernel.py` (one program per image, no host read; the same rows, the sums in another
float order). The fake implementation reads shapes only. The exporter maps the op to `com.raggedvit::RaggedMerge`
(exporter/translations.py): a merging block exports as that node between the attention residual and norm2, its
key_bias the next block's proportional attention, its cu the next blocks' cu_seqlens.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from raggedvit.pruning.merge import MergedRows, merge_tokens_reference, merge_widths, merged_count

__all__ = ["MergeKeys", "merge_tokens", "merge_tokens_op"]


class MergeKeys(NamedTuple):
    """Where a block's merge metric comes from: qkv [T, 3*H*Dh] (after q/k norm, if any), bias [3*H*Dh] or None (the
    qkv bias not yet added to qkv), num_heads H."""

    qkv: torch.Tensor
    bias: torch.Tensor | None
    num_heads: int


def _check(
    x: torch.Tensor, keys: MergeKeys, size: torch.Tensor | None, cu: torch.Tensor, num_prefix: int, r: int
) -> None:
    """Validate shapes, dtypes, devices and the static arguments (never reads tensor data)."""
    if x.dim() != 2 or not x.is_floating_point():
        raise ValueError(f"x must be 2-D [T, C] floating point, got shape {tuple(x.shape)} {x.dtype}")
    if cu.dim() != 1 or cu.shape[0] < 2 or cu.dtype != torch.int64:
        raise ValueError(f"cu must be 1-D [B+1] int64 with B >= 1, got shape {tuple(cu.shape)} {cu.dtype}")
    T, B = x.shape[0], cu.shape[0] - 1
    if T % B:
        raise ValueError(f"x has {T} rows, not a multiple of the {B} images of cu (shape {tuple(cu.shape)})")
    qkv, bias, heads = keys
    if qkv.dim() != 2 or qkv.shape[0] != T or heads < 1 or qkv.shape[1] % (3 * heads) or qkv.dtype != x.dtype:
        raise ValueError(
            f"qkv must be [T={T}, 3*H*Dh] {x.dtype} with H={heads}, got shape {tuple(qkv.shape)} {qkv.dtype}"
        )
    if bias is not None and (tuple(bias.shape) != (qkv.shape[1],) or bias.dtype != x.dtype):
        raise ValueError(f"qkv_bias must be [{qkv.shape[1]}] {x.dtype}, got shape {tuple(bias.shape)} {bias.dtype}")
    if size is not None and (tuple(size.shape) != (T,) or size.dtype != torch.float32):
        raise ValueError(f"size must be [{T}] float32, got shape {tuple(size.shape)} {size.dtype}")
    for name, t in (("qkv", qkv), ("qkv_bias", bias), ("size", size), ("cu", cu)):
        if t is not None and t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}")
    if not 0 <= num_prefix <= T // B or r < 0:
        raise ValueError(f"need 0 <= num_prefix <= n = {T // B} and r >= 0; got {num_prefix}, {r}")


@torch.library.custom_op("raggedvit::merge_tokens", mutates_args=())
def merge_tokens_op(
    x: torch.Tensor,
    qkv: torch.Tensor,
    qkv_bias: torch.Tensor | None,
    size: torch.Tensor | None,
    cu: torch.Tensor,
    num_heads: int,
    num_prefix: int,
    r: int,
    class_token: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    raise NotImplementedError(f"raggedvit::merge_tokens has no kernel for device {x.device}")


@merge_tokens_op.register_kernel("cpu")
def _cpu_kernel(x, qkv, qkv_bias, size, cu, num_heads, num_prefix, r, class_token):
    out = merge_tokens_reference(x, qkv, qkv_bias, size, cu, num_heads, num_prefix, r, class_token)
    return tuple(t.contiguous() for t in out)


@merge_tokens_op.register_kernel("cuda")
def _cuda_kernel(x, qkv, qkv_bias, size, cu, num_heads, num_prefix, r, class_token):
    from raggedvit.kernels._merge_launch import launch_merge

    contig = [None if t is None else t.contiguous() for t in (x, qkv, qkv_bias, size, cu)]
    with torch.cuda.device(x.device):
        return tuple(launch_merge(*contig, num_heads, num_prefix, r, class_token))


@merge_tokens_op.register_fake
def _fake(x, qkv, qkv_bias, size, cu, num_heads, num_prefix, r, class_token):
    T, C = x.shape
    B = cu.shape[0] - 1
    n = T // B
    m = n - merged_count(n, num_prefix, r)
    rows = x.new_empty((B * m,), dtype=torch.float32)
    return (
        x.new_empty((B * m, C)),
        rows,
        cu.new_empty(cu.shape),
        rows.new_empty(rows.shape, dtype=torch.int64),
        rows.new_empty(rows.shape),
        x.new_empty((B * merge_widths(n, num_prefix)[0],), dtype=torch.float32),
    )


def merge_tokens(
    x: torch.Tensor,
    keys: MergeKeys,
    size: torch.Tensor | None,
    cu: torch.Tensor,
    num_prefix: int,
    r: int,
    *,
    class_token: bool = True,
) -> MergedRows:
    """One tome stage's merge on a uniform state (raggedvit/pruning/merge.py; DESIGN.md section 4).

    Args:
        x: [T, C] the rows after the block's attention residual, T = B*n (every image n rows).
        keys: MergeKeys of the block (the metric: the keys averaged over heads, in float32).
        size: [T] float32 tokens in each row, or None (before the first merge: every row one token).
        cu: [B+1] int64 = 0, n, 2n, ... (only its length is read on CUDA).
        num_prefix: p; r: the spec's r (merged_count(n, p, r) rows merge per image).
        class_token: the model has one (ToMe then keeps the unmerged rows in position order).

    Returns:
        MergedRows (x', size', cu', src, key_bias = log(size'), score).
    """
    num_prefix, r = int(num_prefix), int(r)
    if keys.qkv.dtype != x.dtype and x.dtype == torch.float32:  # the fp16 recipe: float16 GEMMs, float32 stream
        # widening is exact, and the metric is computed in float32 anyway: the same merge
        bias = None if keys.bias is None else keys.bias.to(torch.float32)
        keys = MergeKeys(keys.qkv.to(torch.float32), bias, keys.num_heads)
    _check(x, keys, size, cu, num_prefix, r)
    out = merge_tokens_op(x, keys.qkv, keys.bias, size, cu, int(keys.num_heads), num_prefix, r, bool(class_token))
    return MergedRows(*out)
