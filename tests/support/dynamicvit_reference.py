"""DynamicViT (Rao et al., "DynamicViT: Efficient Vision Transformers with Dynamic Token Sparsification", NeurIPS
2021) inference on a timm VisionTransformer, written from the published code as an independent test oracle.

Source: github.com/raoyongming/DynamicViT, `models/dyvit.py` (classes `PredictorLG`,
`VisionTransformerDiffPruning`, its `forward` in eval mode), `utils.py::batch_index_select` and `main.py` /
`infer.py` (token_ratio, pruning_loc, the saved checkpoint). Read to learn the semantics; no code copied, no
raggedvit code used: padded [B, N, C] tensors, the timm model's own modules, the predictor evaluated from its
state dict with torch.nn.functional.

Semantics, each with where it comes from:
- Where: BEFORE block `pruning_loc[s]` (0-based, default (3, 6, 9)) the stage-s predictor scores the current
  tokens, the rows are selected, then the WHOLE block (attention and MLP) runs on the kept rows
  (`VisionTransformerDiffPruning.forward`, eval branch: `x = batch_index_select(x, now_policy); x = blk(x)`).
- What the predictor sees: the patch tokens only, `x[:, 1:]` of the residual stream entering the block (before
  norm1); the class token is neither scored nor dropped (`spatial_x = x[:, 1:]`; `cls_policy` = row 0).
- Predictor (`PredictorLG`): in_conv = LayerNorm(C) (eps 1e-5), Linear(C, C), GELU (erf); of its C channels the
  first C // 2 stay per token ("local") and the last C // 2 are averaged over the image's current patch tokens
  ("global"), concatenated [local, global]; out_conv = Linear(C, C/2), GELU, Linear(C/2, C/4), GELU,
  Linear(C/4, 2), LogSoftmax. The global average is weighted by `prev_decision`, which at eval is all ones
  (`torch.ones(B, init_n, 1)`, only ever gathered): a plain mean over the current patch tokens (class token
  excluded; tokens dropped by an earlier stage are gone).
- Keep channel: output channel 0 is the log-probability of keep (`score = pred_score[:, :, 0]`; in training
  `gumbel_softmax(...)[:, :, 0:1]` is the keep decision).
- Count: stage s keeps `int(P * token_ratio[s])` patch tokens, token_ratio = [rho, rho ** 2, rho ** 3]
  (`main.py` / `infer.py`: `KEEP_RATE = [base_rate, base_rate ** 2, base_rate ** 3]`), computed in Python float64
  and truncated, where P is the patch count before ANY stage (`init_n = 14 * 14`; the published code hard-codes
  196, here P = the model's patch count, 196 for a 224 / 16 model), so the schedule is of the original count,
  not of the tokens left.
- Order: the class token, then the kept patch tokens in DESCENDING keep score (`torch.argsort(score,
  descending=True)[:, :num_keep_node]`, `now_policy = cat([0, keep_policy + 1])`), not in position order. Exact
  ties: lower current row first (the published argsort's tie order is unspecified).
- Head: the timm model's own `norm` and `forward_head` (DynamicViT: `self.head(self.norm(x)[:, 0])`).
- Checkpoint: `{"model": state_dict}` with the backbone's keys plus `score_predictor.{s}.in_conv.{0,1}.*` and
  `score_predictor.{s}.out_conv.{0,2,4}.*` (`utils.py::save_model`; loading unwraps `"model"`:
  `checkpoint_filter_fn`, `infer.py`).

Beyond the published code (one class token): with num_prefix_tokens p > 1 (distillation token, registers) the
predictor scores x[:, p:] and the p prefix rows stay first; without a class token the same with p registers.

Recorded per stage: `kept_index` [B, N_s] int64, the original position of every row after selection (0 = class
token, p + j = patch token j in timm's order), `counts` [B, S] int64, the rows N_s = p + kept, and `keep_score`
[B, n_s], the keep log-probability of every candidate patch token in its current row order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer

__all__ = [
    "DynamicVitReference",
    "dynamicvit_checkpoint",
    "dynamicvit_keep_counts",
    "dynamicvit_predictor_state",
    "dynamicvit_reference_forward",
    "split_dynamicvit_checkpoint",
]

PREFIX = "score_predictor."
_LAYERS = ("in_conv.0", "in_conv.1", "out_conv.0", "out_conv.2", "out_conv.4")  # LayerNorm, then the Linears


class DynamicVitReference(NamedTuple):
    """logits [B, classes]; per stage kept_index [B, N_s] int64 (original positions) and keep_score [B, n_s]
    (candidates' keep log-probability, current row order); counts [B, S] int64 (rows after each stage)."""

    logits: torch.Tensor
    kept_index: tuple[torch.Tensor, ...]
    counts: torch.Tensor
    keep_score: tuple[torch.Tensor, ...]


def dynamicvit_keep_counts(num_patches: int, rho: float, stages: int = 3) -> tuple[int, ...]:
    """Patch tokens kept after each stage: int(P * rho ** (s + 1)) of the original P, float64, truncated."""
    return tuple(int(num_patches * rho ** (s + 1)) for s in range(stages))


def dynamicvit_predictor_state(embed_dim: int, stages: int = 3, seed: int = 0) -> dict[str, torch.Tensor]:
    """A seeded PredictorLG state per stage under DynamicViT's checkpoint names -> {name: float32 tensor}.

    Linear weights ~ N(0, (1.5^2 or, for the last, 1) / fan_in), far larger than DynamicViT's trunc_normal(0.02)
    init, so keep scores spread (std ~0.5 nat) instead of sitting at log 0.5 as an untrained predictor's do; the
    last bias leans to drop (keep -1, drop +1) so that no log-probability saturates at 0, where float32 would tie
    them. Other biases and the LayerNorm offsets are small.
    """
    if embed_dim % 4:
        raise ValueError(f"PredictorLG needs embed_dim divisible by 4, got {embed_dim}")
    gen = torch.Generator().manual_seed(seed)
    C = embed_dim
    widths = {"in_conv.1": (C, C), "out_conv.0": (C // 2, C), "out_conv.2": (C // 4, C // 2), "out_conv.4": (2, C // 4)}
    state: dict[str, torch.Tensor] = {}
    for s in range(stages):
        pre = f"{PREFIX}{s}."
        state[pre + "in_conv.0.weight"] = 1 + 0.1 * torch.randn(C, generator=gen)
        state[pre + "in_conv.0.bias"] = 0.1 * torch.randn(C, generator=gen)
        for name, (out_f, in_f) in widths.items():
            gain = 1.0 if name == "out_conv.4" else 1.5
            state[pre + name + ".weight"] = torch.randn(out_f, in_f, generator=gen) * (gain / in_f**0.5)
            state[pre + name + ".bias"] = 0.1 * torch.randn(out_f, generator=gen)
        state[pre + "out_conv.4.bias"] += torch.tensor([-1.0, 1.0])  # keep log-probabilities well below 0
    return state


def dynamicvit_checkpoint(vit: VisionTransformer, seed: int = 0, stages: int = 3) -> dict[str, dict[str, torch.Tensor]]:
    """{"model": backbone state dict + seeded predictor state}, as DynamicViT saves a trained model."""
    model = {k: v.detach().clone() for k, v in vit.state_dict().items()}
    model.update(dynamicvit_predictor_state(vit.embed_dim, stages, seed))
    return {"model": model}


def split_dynamicvit_checkpoint(
    checkpoint: Mapping[str, object],
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A DynamicViT checkpoint, {"model": state} or the bare state -> (backbone state, predictor state)."""
    state = checkpoint["model"] if "model" in checkpoint else checkpoint
    backbone = {k: v for k, v in state.items() if not k.startswith(PREFIX)}
    predictor = {k: v for k, v in state.items() if k.startswith(PREFIX)}
    return backbone, predictor


def _num_stages(state: Mapping[str, torch.Tensor]) -> int:
    stages = {int(k[len(PREFIX) :].split(".", 1)[0]) for k in state if k.startswith(PREFIX)}
    if stages != set(range(len(stages))):
        raise ValueError(f"predictor stages must be 0..S-1, got {sorted(stages)}")
    missing = [f"{PREFIX}{s}.{n}.{t}" for s in stages for n in _LAYERS for t in ("weight", "bias")]
    missing = [k for k in missing if k not in state]
    if missing:
        raise ValueError(f"predictor state lacks {missing[:4]}")
    return len(stages)


def _keep_log_prob(state: Mapping[str, torch.Tensor], s: int, tokens: torch.Tensor) -> torch.Tensor:
    """PredictorLG of stage s on tokens [B, n, C] (eval policy: all ones) -> keep log-probability [B, n]."""
    w = {n: (state[f"{PREFIX}{s}.{n}.weight"], state[f"{PREFIX}{s}.{n}.bias"]) for n in _LAYERS}
    C = tokens.shape[-1]
    h = F.gelu(F.linear(F.layer_norm(tokens, (C,), *w["in_conv.0"], eps=1e-5), *w["in_conv.1"]))
    half = C // 2
    glob = h[..., half:].mean(dim=1, keepdim=True).expand(-1, h.shape[1], -1)
    h = torch.cat((h[..., :half], glob), dim=-1)
    h = F.gelu(F.linear(h, *w["out_conv.0"]))
    h = F.gelu(F.linear(h, *w["out_conv.2"]))
    return F.log_softmax(F.linear(h, *w["out_conv.4"]), dim=-1)[..., 0]


@torch.no_grad()
def dynamicvit_reference_forward(
    vit: VisionTransformer,
    predictor_state: Mapping[str, torch.Tensor],
    images: torch.Tensor,
    rho: float = 0.7,
    pruning_loc: tuple[int, ...] = (3, 6, 9),
) -> DynamicVitReference:
    """DynamicViT's eval forward of a timm VisionTransformer (eval mode) on images [B, 3, H, W].

    predictor_state: the `score_predictor.*` entries (other keys ignored), one stage per pruning_loc entry.
    Returns logits [B, classes], kept_index and keep_score per stage, counts [B, S]."""
    state = {k: v.to(images.device) for k, v in predictor_state.items() if k.startswith(PREFIX)}
    stages = _num_stages(state)
    if stages != len(pruning_loc):
        raise ValueError(f"{stages} predictor stages for {len(pruning_loc)} pruning blocks {pruning_loc}")
    if not 0 < rho <= 1:
        raise ValueError(f"rho must be in (0, 1], got {rho}")
    if list(pruning_loc) != sorted(set(pruning_loc)) or any(not 0 <= i < len(vit.blocks) for i in pruning_loc):
        raise ValueError(f"pruning_loc must be increasing block indices of 0..{len(vit.blocks) - 1}: {pruning_loc}")
    p = vit.num_prefix_tokens
    x = vit.norm_pre(vit.patch_drop(vit._pos_embed(vit.patch_embed(images))))
    B, N, _ = x.shape
    keep = dynamicvit_keep_counts(N - p, rho, stages)
    index = torch.arange(N, device=x.device).expand(B, N)
    kept_index: list[torch.Tensor] = []
    scores: list[torch.Tensor] = []
    for i, blk in enumerate(vit.blocks):
        if i in pruning_loc:
            s = pruning_loc.index(i)
            score = _keep_log_prob(state, s, x[:, p:])  # [B, n]
            order = torch.sort(score, dim=1, descending=True, stable=True).indices[:, : keep[s]]
            x = torch.cat((x[:, :p], torch.take_along_dim(x[:, p:], order[..., None], dim=1)), dim=1)
            index = torch.cat((index[:, :p], torch.take_along_dim(index[:, p:], order, dim=1)), dim=1)
            kept_index.append(index)
            scores.append(score)
        x = blk(x)
    logits = vit.forward_head(vit.norm(x))
    counts = torch.tensor([[k.shape[1] for k in kept_index]] * B, dtype=torch.int64).reshape(B, stages)
    return DynamicVitReference(logits, tuple(kept_index), counts, tuple(scores))
