"""timm's multi-head attention pooling (MAP, `timm.layers.AttentionPoolLatent`) over each image's kept rows.

SigLIP's `global_pool='map'` (and EVA's) pools the final tokens with learned latent queries. On packed rows the
pooling is a cross-attention with `latent_len` queries per image over that image's rows: the queries do not depend
on the input (q = q(latent) is computed once), keys and values are projected on the packed rows, then gathered into
the padded layout [B, W, ...] (select.pad_rows) where a key mask gives padding slots exactly zero weight. Plain ONNX
ops (MatMul, Where, Softmax): with one query per image the attention is a [B, H, L, W] product, far below the cost
of a block.
"""

from __future__ import annotations

import torch
from timm.layers import AttentionPoolLatent

from raggedvit.pruning.backbone import module_dtype
from raggedvit.pruning.select import pad_rows, padded_slots

__all__ = ["check_map_pool", "map_pool"]


def check_map_pool(pool: AttentionPoolLatent) -> None:
    """Raise ValueError (one line) unless `map_pool` runs `pool`."""
    if type(pool) is not AttentionPoolLatent:
        raise ValueError(f"attention pooling {type(pool).__name__} is not supported; only timm's AttentionPoolLatent")
    if pool.pos_embed is not None:
        raise ValueError("AttentionPoolLatent with pos_embed='abs' is not supported (no timm model builds one)")
    if pool.pool not in ("token", "avg", ""):
        raise ValueError(f"AttentionPoolLatent pool_type {pool.pool!r} is not supported; expected 'token' or 'avg'")


def map_pool(
    pool: AttentionPoolLatent,
    x: torch.Tensor,
    cu: torch.Tensor,
    width: int,
    *,
    skip: int = 0,
) -> torch.Tensor:
    """timm's AttentionPoolLatent.forward over each image's rows of a packed batch.

    Args:
        pool: timm's AttentionPoolLatent (eval mode; pos_embed None: see check_map_pool).
        x: [T, C] packed rows (after the model's final norm); image b is rows [cu[b], cu[b+1]).
        cu: [B+1] int64 cumulative row counts.
        width: static bound of every image's row count (the padded layout's W).
        skip: leading rows of each image the pool does not read (timm's ViT pools x[:, num_prefix:] unless
            pool_include_prefix); every image must keep at least one row after them.

    Returns:
        [B, out_features] in the pool's dtype: per image, pool(x_b[None, skip:])[0] where x_b = x[cu[b]:cu[b+1]]
        (latent_len > 1: the pool's 'token' / 'avg' reduction of the latents, or [B, L, out] for pool_type '').
    """
    check_map_pool(pool)
    dtype = module_dtype(pool, x.dtype)
    B = cu.shape[0] - 1
    H, D, L = pool.num_heads, pool.head_dim, pool.latent_len
    E = H * D
    n = cu[1:] - cu[:-1]
    rows, valid = padded_slots(cu, n, width)  # [B, W]
    if skip:
        valid = valid & (torch.arange(width, device=cu.device) >= skip)
    q = pool.q(pool.latent.to(dtype)).reshape(1, L, H, D).transpose(1, 2)  # [1, H, L, D]
    kv = pad_rows(pool.kv(x.to(dtype)), rows)  # [B, W, 2E]: the projection on the T packed rows, then a gather
    k, v = kv.reshape(B, width, 2, H, D).permute(2, 0, 3, 1, 4).unbind(0)  # each [B, H, W, D]
    q, k = pool.q_norm(q), pool.k_norm(k)
    scores = torch.matmul(q * pool.scale, k.transpose(-2, -1))  # [B, H, L, W]
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    attn = scores.softmax(dim=-1)  # padding slots: exp(-inf) = 0 exactly
    out = torch.matmul(attn, v).transpose(1, 2).reshape(B, L, E)  # [B, L, E]
    out = pool.proj_drop(pool.proj(out))
    if pool.mlp is not None:
        out = out + pool.mlp(pool.norm(out))
    if pool.pool == "token":
        return out[:, 0]
    if pool.pool == "avg":
        return out.mean(1)
    return out
