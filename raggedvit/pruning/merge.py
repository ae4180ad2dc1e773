"""Token merging (ToMe: Bolya et al., "Token Merging: Your ViT But Faster", ICLR 2023) as a PrunedViT stage: the one
definition of the merge (DESIGN.md section 4, "Token merging").

A tome stage runs inside its block, between the attention and the MLP, on a uniform state (every image has n rows,
the first p of them prefix tokens: class, distillation, registers, which never merge):
1. metric: the block's keys averaged over heads, [n, D] per image (float32); cosine similarity.
2. Bipartite soft matching: the patch rows alternate between set A (even positions) and set B (odd positions), as
   ToMe's `x[..., ::2, :]` / `x[..., 1::2, :]` over the whole sequence does when the prefix (class, distillation)
   tokens are left out of both sets; each A row's edge goes to its most similar B row (ties: the lowest B index),
   and the r A rows with the most similar edges merge (a stable descending sort: ties, the lower A index first),
   r = `merged_count` = min(r, (n - p) // 2).
3. Size-weighted average: each row carries its size (tokens merged into it, float32); a B row's new value is
   (x_B s_B + sum of x_a s_a merged into it) / (s_B + sum of s_a), its size the denominator.
4. The new rows per image: the prefix rows, the unmerged A rows, then every B row in position order (ToMe's
   [unmerged, destinations]). With a class token, ToMe sorts the unmerged rows back into position order (to keep
   the class token first); without one it leaves them in the matching's order, most similar edge first, which sets
   the next block's A / B split: both as ToMe's code does. Each row keeps the token index of the token it is named
   after (a B row: its own; the destination of a merge names the merged row).
The next block adds log(size) of each key to its attention scores (proportional attention, the ragged op's
key_bias). Static shapes: the counts depend on n, p and r only, so a tome export runs as a CUDA graph. No scatter:
the sums of step 3 are a batched product with a one-hot [n_B, r] matrix per image (ONNX Runtime's CPU ScatterND with
an add reduction races on repeated indices).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from raggedvit.pruning.spec import merged_count

__all__ = [
    "METRIC_EPS",
    "Matching",
    "bipartite_soft_matching",
    "carry_rows",
    "key_metric",
    "merge_rows",
    "merge_sets",
    "merge_tokens_reference",
    "merge_widths",
    "merged_count",
    "MergedRows",
    "residual_rows",
]

METRIC_EPS = 1e-12  # floor of a metric row's norm before the cosine similarity (a zero key has no direction)


def merge_sets(n: int, num_prefix: int) -> tuple[int, int]:
    """First positions of sets A and B among n rows with p prefix rows: A = even positions >= p, B = odd ones
    (slices `a0::2`, `b0::2`)."""
    a0 = num_prefix + num_prefix % 2
    return a0, num_prefix + 1 - num_prefix % 2


def key_metric(qkv: torch.Tensor, num_heads: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Step 1's metric: the keys of qkv [T, 3*H*Dh] (+ the k part of the qkv bias [3*H*Dh], both in float32)
    averaged over the H heads -> [T, Dh] float32."""
    T, width = qkv.shape
    hd = width // 3
    k = qkv[:, hd : 2 * hd].to(torch.float32)
    if bias is not None:
        k = k + bias[hd : 2 * hd].to(torch.float32)
    return k.reshape(T, num_heads, hd // num_heads).mean(dim=1)


def merge_widths(n: int, num_prefix: int) -> tuple[int, int]:
    """(n_A, n_B): the sizes of sets A and B among n rows with p prefix rows."""
    a0, b0 = merge_sets(n, num_prefix)
    return max(0, (n - a0 + 1) // 2), max(0, (n - b0 + 1) // 2)


class Matching(NamedTuple):
    """One merge decision for B images (n_A, n_B: the sizes of sets A and B; r: the rows merged per image).

    merged [B, r] int64: the A indices (0..n_A-1) that merge, most similar first; dst [B, r] int64: the B index each
    merges into; kept [B, n_A - r] int64: the A indices that stay, ascending (with a class token) or most similar
    first (without: ToMe's order); score [B, n_A] float32: each A row's
    best cosine similarity to B (the scores the r best are chosen by)."""

    merged: torch.Tensor
    dst: torch.Tensor
    kept: torch.Tensor
    score: torch.Tensor


def bipartite_soft_matching(metric: torch.Tensor, num_prefix: int, r: int, *, class_token: bool = True) -> Matching:
    """ToMe's matching of step 2. metric [B, n, D] (any float dtype; float32 arithmetic); r <= merged_count(n, p, r).
    class_token: the model has one (the kept A rows in position order; else in the matching's order, step 4)."""
    B, n, _ = metric.shape
    a0, b0 = merge_sets(n, num_prefix)
    m = metric.to(torch.float32)
    m = m / m.norm(dim=-1, keepdim=True).clamp_min(METRIC_EPS)
    scores = m[:, a0::2] @ m[:, b0::2].transpose(1, 2)  # [B, n_A, n_B]
    if scores.shape[2] == 0:  # no B row (n - p < 2): nothing merges, every score -inf
        score = torch.full(scores.shape[:2], float("-inf"), device=metric.device)
        best = torch.zeros(scores.shape[:2], dtype=torch.int64, device=metric.device)
    else:
        score, best = scores.max(dim=2)  # ties: the first (lowest) B index
    order = torch.sort(score, dim=1, descending=True, stable=True).indices  # [B, n_A]
    merged = order[:, :r]
    kept = torch.sort(order[:, r:], dim=1).values if class_token else order[:, r:]
    return Matching(merged, best.gather(1, merged), kept, score)


def carry_rows(t: torch.Tensor, match: Matching, num_prefix: int) -> torch.Tensor:
    """A per-row value that names its row (token index, seq id) after the merge: t [B, n, ...] -> [B, n - r, ...]
    = prefix rows, the kept A rows, every B row (step 4)."""
    n = t.shape[1]
    a0, b0 = merge_sets(n, num_prefix)
    ta = t[:, a0::2]
    kept = match.kept.reshape(*match.kept.shape, *([1] * (t.dim() - 2))).expand(-1, -1, *t.shape[2:])
    return torch.cat((t[:, :num_prefix], ta.gather(1, kept), t[:, b0::2]), dim=1)


def merge_rows(
    x: torch.Tensor, size: torch.Tensor, match: Matching, num_prefix: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 3 and 4: x [B, n, C] (any float dtype), size [B, n] float32 -> (x' [B, n - r, C] in x's dtype, size'
    [B, n - r] float32). A B row's average is summed in float32 and rounded to x's dtype once; prefix rows and the
    kept A rows are moved unchanged."""
    B, n, C = x.shape
    a0, b0 = merge_sets(n, num_prefix)
    xa, xb = x[:, a0::2], x[:, b0::2]
    sa, sb = size[:, a0::2], size[:, b0::2]
    r = match.merged.shape[1]
    n_b = xb.shape[1]
    s_src = sa.gather(1, match.merged)  # [B, r]
    x_src = xa.gather(1, match.merged.unsqueeze(2).expand(B, r, C)).to(torch.float32) * s_src.unsqueeze(2)
    onehot = (torch.arange(n_b, device=x.device).view(1, n_b, 1) == match.dst.unsqueeze(1)).to(torch.float32)
    total = xb.to(torch.float32) * sb.unsqueeze(2) + torch.bmm(onehot, x_src)  # [B, n_B, C]
    size_b = sb + torch.bmm(onehot, s_src.unsqueeze(2)).squeeze(2)  # [B, n_B]
    x_b = (total / size_b.unsqueeze(2)).to(x.dtype)
    x_kept = xa.gather(1, match.kept.unsqueeze(2).expand(B, match.kept.shape[1], C))
    new_x = torch.cat((x[:, :num_prefix], x_kept, x_b), dim=1)
    new_size = torch.cat((size[:, :num_prefix], sa.gather(1, match.kept), size_b), dim=1)
    return new_x, new_size


class MergedRows(NamedTuple):
    """The outputs of one merge (`merge_tokens_reference`, the op com.raggedvit::RaggedMerge) for B images of n rows,
    m = n - merged_count(n, p, r) rows each after it, n_A A slots each:

    x [B*m, C] in x's dtype; size [B*m] float32 (tokens in each row); cu [B+1] int64 (= b*m); src [B*m] int64 (the
    input row, b*n + position, each output row is named after); key_bias [B*m] float32 (= log(size): the next
    block's proportional attention); score [B*n_A] float32 (each A row's best cosine similarity to B, A order)."""

    x: torch.Tensor
    size: torch.Tensor
    cu: torch.Tensor
    src: torch.Tensor
    key_bias: torch.Tensor
    score: torch.Tensor


def residual_rows(
    x: torch.Tensor, skip: torch.Tensor | None = None, skip_bias: torch.Tensor | None = None
) -> torch.Tensor:
    """The rows a merge takes when the block's attention residual is the op's (RaggedMerge's skip inputs, which the
    exporter folds the residual Add and the proj bias Add into): x + (skip + skip_bias), each sum in float32 and
    rounded to x's dtype, as the two ONNX Adds it replaces round them. x [T, C], skip [T, C] (x's dtype) or None
    (x unchanged), skip_bias [C] (x's dtype) or None."""
    if skip is None:
        return x
    if skip_bias is not None:
        skip = (skip.to(torch.float32) + skip_bias.to(torch.float32)).to(x.dtype)
    return (x.to(torch.float32) + skip.to(torch.float32)).to(x.dtype)


def merge_tokens_reference(
    x: torch.Tensor,
    qkv: torch.Tensor,
    qkv_bias: torch.Tensor | None,
    size: torch.Tensor | None,
    cu: torch.Tensor,
    num_heads: int,
    num_prefix: int,
    r: int,
    class_token: bool,
    skip: torch.Tensor | None = None,
    skip_bias: torch.Tensor | None = None,
) -> MergedRows:
    """One tome stage's merge from the block's qkv (steps 1-4): the one definition of com.raggedvit::RaggedMerge.

    Args:
        x: [T, C] float32 / float16 / bfloat16, the rows after the block's attention residual (with skip: the
            residual stream before it); T = B*n (every image n rows, image b the rows [b*n, (b+1)*n)).
        qkv: [T, 3*H*Dh] (x's dtype), the block's qkv (q, k, v, each H heads of Dh); the metric is the k part
            (+ qkv_bias's k part, both in float32) averaged over the H heads: [T, Dh] float32.
        qkv_bias: [3*H*Dh] (x's dtype) or None.
        size: [T] float32 tokens in each row, or None (every row one token).
        cu: [B+1] int64 (B >= 1), cu[b] = b*n (only its length is read here).
        num_heads: H; num_prefix: p (prefix rows never merge); r: the spec's r (merged_count(n, p, r) merge);
        class_token: ToMe's order of the unmerged A rows (module docstring, step 4).
        skip: [T, C] (x's dtype) or None; skip_bias: [C] (x's dtype) or None: the rows merged are
            `residual_rows(x, skip, skip_bias)` (the export's fused attention residual; PrunedViT passes neither).

    Returns:
        MergedRows.
    """
    x = residual_rows(x, skip, skip_bias)
    T, C = x.shape
    B = cu.shape[0] - 1
    n = T // B
    metric = key_metric(qkv, num_heads, qkv_bias)  # [T, Dh]
    r_eff = merged_count(n, num_prefix, r)
    m = n - r_eff
    if size is None:
        size = torch.ones(T, dtype=torch.float32, device=x.device)
    match = bipartite_soft_matching(metric.reshape(B, n, metric.shape[1]), num_prefix, r_eff, class_token=class_token)
    new_x, new_size = merge_rows(x.reshape(B, n, C), size.reshape(B, n), match, num_prefix)
    rows = torch.arange(T, device=x.device).reshape(B, n)
    src = carry_rows(rows, match, num_prefix).reshape(-1)
    new_size = new_size.reshape(-1)
    steps = torch.arange(B + 1, device=x.device)
    return MergedRows(new_x.reshape(B * m, C), new_size, steps * m, src, torch.log(new_size), match.score.reshape(-1))
