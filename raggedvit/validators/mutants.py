"""Export faults the validator must catch (the mutation suite, tests/validators/test_mutations.py, and the GPU study
benchmarks.validate_study): each mutant changes a copy of the model (or its spec) before export.

The mutated model is exported with the ORIGINAL model's recipe restored in the ONNX metadata, so the file says
nothing about the fault: `validate` rebuilds the original reference from the recipe (and `--checkpoint`) and
has to see the difference in the outputs (or, for a fault written in the graph's attributes, in the graph) alone.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from unittest import mock

import onnx
import torch
from timm.models.vision_transformer import VisionTransformer

from raggedvit.exporter import export_onnx
from raggedvit.exporter.metadata import read_recipe, write_recipe
from raggedvit.pruning import PruneSpec
from raggedvit.validators.report import ValidationReport
from raggedvit.weights import load_vit, perturb_biases_and_norms_

__all__ = [
    "BASE_SPEC",
    "DYNAMICVIT_MUTANTS",
    "DYNAMICVIT_SPEC",
    "MUTANTS",
    "MUTATED_BLOCK",
    "TOME_MUTANTS",
    "TOME_SPEC",
    "Mutant",
    "export_mutant",
    "seeded_predictor_state",
    "write_base_checkpoint",
]

MODEL = "deit_tiny_patch16_224"
# three topk-l2 stages keep 98, 49 and 25 of deit_tiny's 196 patches (ceil(P * 0.5))
BASE_SPEC = PruneSpec("topk-l2", (3, 6, 9), keep=0.5)
# token merging in five blocks (the merge inside each, so a stage's block is its own): 197 -> 181 -> 165 -> 149 ->
# 133 -> 117 tokens; the first merge has sizes of 1 only, faults in the size weighting or the proportional attention
# show from block 1 (stage 1)
TOME_SPEC = PruneSpec("tome", (0, 1, 2, 5, 8), r=16)
MUTATED_BLOCK = 5  # the block a single-block mutant changes: after the first stage, before the last


@dataclass(frozen=True)
class Mutant:
    """`mutate(vit, spec)` changes `vit` (a private copy) in place and returns the spec to export with. `first`:
    text of each image's first failure in the report (or one of several), naming the mutated block, stage or the
    head; `structure`: text of the structural failure (validators/structure.py) of a fault written in the graph's
    attributes (None: the mutant changes no attribute the check compares). `patch`: a context manager factory active
    while the mutant is exported (a fault in PrunedViT's code rather than the weights: the export traces the faulty
    forward)."""

    name: str
    mutate: Callable[[VisionTransformer, PruneSpec], PruneSpec]
    first: str | tuple[str, ...] = f"block {MUTATED_BLOCK} drifts"
    structure: str | None = None  # text of a structural failure the mutant must cause (a fault in the graph)
    patch: Callable[[], contextlib.AbstractContextManager] | None = None

    def names_it(self, message: str) -> bool:
        """`message` (an image's first failure) names the fault as `first` says."""
        return any(text in message for text in ((self.first,) if isinstance(self.first, str) else self.first))

    def named_by(self, report: ValidationReport, *, per_image_required: bool) -> bool:
        """The report names this fault: its structural failures include `structure` (when set) and no other mutant
        changes the structure check's attributes, and the first failure of every failing image names it
        (`names_it`). per_image_required: some image must fail (far past the bar: fp32; a fault that only the
        structure shows, as LayerNorm eps x100 in fp16, need not)."""
        structural = [f.message for f in report.failures if f.kind == "structure"]
        if self.structure is None:
            if structural:
                return False
        elif not any(self.structure in m for m in structural):
            return False
        per_image = [f for f in report.failures if f.image is not None]
        if not per_image and (per_image_required or self.structure is None):
            return False
        first = {}
        for f in per_image:
            first.setdefault(f.image, f.message)
        return all(self.names_it(m) for m in first.values())


def _drop_bias(layer: str) -> Callable[[VisionTransformer, PruneSpec], PruneSpec]:
    def mutate(vit: VisionTransformer, spec: PruneSpec) -> PruneSpec:
        blk = vit.blocks[MUTATED_BLOCK]
        linear = {"qkv": blk.attn.qkv, "proj": blk.attn.proj, "fc1": blk.mlp.fc1, "fc2": blk.mlp.fc2}[layer]
        assert float(linear.bias.abs().max()) > 0, "the base checkpoint must have non-zero biases"
        linear.bias.zero_()
        return spec

    return mutate


def _swap_q_heads(vit: VisionTransformer, spec: PruneSpec) -> PruneSpec:
    """Heads 0 and 1 swap their queries (q rows of qkv): head 0 scores q1 against k0, head 1 q0 against k1."""
    qkv = vit.blocks[MUTATED_BLOCK].attn.qkv
    d = vit.blocks[MUTATED_BLOCK].attn.head_dim
    for p in (qkv.weight, qkv.bias):
        p[: 2 * d] = torch.cat((p[d : 2 * d], p[:d])).clone()
    return spec


def _softmax_scale(vit: VisionTransformer, spec: PruneSpec) -> PruneSpec:
    for blk in vit.blocks:
        blk.attn.scale = blk.attn.scale * 1.1
    return spec


def _stage_late(vit: VisionTransformer, spec: PruneSpec) -> PruneSpec:
    at = list(spec.prune_at)
    at[0] += 1
    return replace(spec, prune_at=tuple(at))


def _keep_plus_one(vit: VisionTransformer, spec: PruneSpec) -> PruneSpec:
    """One more patch token at the first stage: keep k + 1/2 of P gives ceil(P * keep') = k + 1."""
    patches = int(vit.patch_embed.num_patches)
    k = math.ceil(patches * spec.keep)
    return replace(spec, keep=(k + 0.5) / patches)


def _layernorm_eps(vit: VisionTransformer, spec: PruneSpec) -> PruneSpec:
    for m in vit.modules():
        if isinstance(m, torch.nn.LayerNorm):
            m.eps *= 100
    return spec


def _scale_weight(where: str) -> Callable[[VisionTransformer, PruneSpec], PruneSpec]:
    def mutate(vit: VisionTransformer, spec: PruneSpec) -> PruneSpec:
        linear = vit.head if where == "head" else vit.blocks[MUTATED_BLOCK].mlp.fc1
        linear.weight.mul_(1.05)
        return spec

    return mutate


MUTANTS = [
    *(Mutant(f"drop_{layer}_bias", _drop_bias(layer)) for layer in ("qkv", "proj", "fc1", "fc2")),
    Mutant("swap_q_heads", _swap_q_heads),
    Mutant("softmax_scale_x1.1", _softmax_scale, "block 0 drifts", "block 0: attention scale 0.1375 in the export"),
    # the first stage kept other tokens (ranked after block 3, not block 2), or the same ones and block 3's rows
    # are not the stage's
    Mutant(
        "prune_stage_one_block_late",
        _stage_late,
        (
            f"stage 0 (block {BASE_SPEC.prune_at[0]}) kept",
            f"block {BASE_SPEC.prune_at[0]} (the first block after stage 0)",
        ),
    ),
    Mutant("keep_one_more_token", _keep_plus_one, f"moved at stage 0 (block {BASE_SPEC.prune_at[0]})"),
    Mutant(  # every block's norms: in fp16 under the drift rule (half the fp16 floor), in the graph at every block
        "layernorm_eps_x100", _layernorm_eps, "block 0 drifts", "block 0: norm epsilon 0.0001 in the export, 1e-06"
    ),
    Mutant("fc1_weight_x1.05", _scale_weight("fc1")),
    Mutant("head_weight_x1.05", _scale_weight("head"), "the fault is past the last block (the head)"),
]


def _same(vit: VisionTransformer, spec: PruneSpec) -> PruneSpec:
    return spec


def _merge_one_more(vit: VisionTransformer, spec: PruneSpec) -> PruneSpec:
    return replace(spec, r=spec.r + 1)


def _no_proportional_attention():
    """Every block attends without log(size): the key bias is dropped before the op."""
    from raggedvit.pruning import packed_block

    real = packed_block.ragged_attention

    def attention(*args, key_bias=None, **kwargs):
        return real(*args, **kwargs)

    return mock.patch.object(packed_block, "ragged_attention", attention)


def _merge_call(change: Callable[[dict], None]):
    """A fault in the arguments PrunedViT gives the merge op (`packed.merge_tokens`, a RaggedMerge node in the
    export): `change` edits them (x, keys, size, cu, num_prefix, r, class_token) in place."""
    from raggedvit.pruning import packed

    real = packed.merge_tokens

    def merge_tokens(x, keys, size, cu, num_prefix, r, *, class_token=True):
        args = {"x": x, "keys": keys, "size": size, "cu": cu, "num_prefix": num_prefix, "r": r}
        args["class_token"] = class_token
        change(args)
        return real(**args)

    return mock.patch.object(packed, "merge_tokens", merge_tokens)


def _unweighted_merge():
    """Every merge without the rows' sizes (each row counted as one token: averages unweighted, sizes restarted):
    from the first merge of a merged row on."""
    return _merge_call(lambda a: a.update(size=None))


def _sets_shifted():
    """The sets A and B of the matching shifted by one prefix row (the op told one more prefix row): other tokens
    merge from block 0 on."""
    return _merge_call(lambda a: a.update(num_prefix=a["num_prefix"] + 1))


def _metric_from_queries():
    """The similarity of the queries instead of the keys (q and k exchanged in the qkv the op reads)."""

    def swap(a: dict) -> None:
        qkv, bias, heads = a["keys"]
        hd = qkv.shape[1] // 3
        q_as_k = torch.cat((qkv[:, hd : 2 * hd], qkv[:, :hd], qkv[:, 2 * hd :]), dim=1)
        qb = None if bias is None else torch.cat((bias[hd : 2 * hd], bias[:hd], bias[2 * hd :]))
        a["keys"] = type(a["keys"])(q_as_k, qb, heads)

    return _merge_call(swap)


def _unsorted_kept_rows():
    """The unmerged rows left in the matching's order although the model has a class token (ToMe's order without
    one): the same tokens, other rows, from block 0 on."""
    return _merge_call(lambda a: a.update(class_token=False))


def _first_after(stage: int) -> str:
    """A tome stage's block is its own stage's block: the report names it as the first block after the stage."""
    block = TOME_SPEC.prune_at[stage]
    return f"block {block} (the first block after stage {stage}) drifts"


# token merging faults, validated against TOME_SPEC
TOME_MUTANTS = [
    Mutant("tome_no_proportional_attention", _same, _first_after(1), patch=_no_proportional_attention),
    Mutant("tome_unweighted_average", _same, _first_after(1), patch=_unweighted_merge),
    Mutant("tome_sets_shifted", _same, _first_after(0), patch=_sets_shifted),  # other tokens merged
    Mutant("tome_metric_from_queries", _same, "stage 0 (block 0) kept", patch=_metric_from_queries),
    Mutant("tome_unsorted_kept_rows", _same, _first_after(0), patch=_unsorted_kept_rows),
    Mutant("tome_merge_one_more", _merge_one_more, "moved at stage 0 (block 0)"),
]


# DynamicViT's schedule at its published blocks: 196 patches -> 137, 96, 67 (int(196 * 0.7^(s+1)))
DYNAMICVIT_SPEC = PruneSpec("dynamicvit", (3, 6, 9), keep=0.7)


def seeded_predictor_state(dim: int, stages: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded DynamicViT predictors under its checkpoint names (`score_predictor.{s}.…`), with weights large enough
    that the keep scores spread (an untrained predictor's sit at log 0.5, tied in float32)."""
    from raggedvit.pruning.scorers import DynamicVitPredictor

    gen = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for s in range(stages):
        predictor = DynamicVitPredictor(dim)
        for name, p in predictor.state_dict().items():
            if name.endswith("weight") and p.dim() == 2:
                value = torch.randn(p.shape, generator=gen) * (1.5 / p.shape[1] ** 0.5)
            elif name.startswith("in_conv.0.weight"):
                value = 1 + 0.1 * torch.randn(p.shape, generator=gen)
            else:
                value = 0.1 * torch.randn(p.shape, generator=gen)
            state[f"score_predictor.{s}.{name}"] = value
    return state


def _nudge_predictor(vit: VisionTransformer, spec: PruneSpec) -> PruneSpec:
    """One predictor weight x1.05 (stage 0's second out_conv Linear)."""
    from raggedvit.pruning.factory import policy_state, set_policy_state

    state = policy_state(vit)
    state["score_predictor.0.out_conv.2.weight"] = state["score_predictor.0.out_conv.2.weight"] * 1.05
    set_policy_state(vit, state)
    return spec


def _stages_swapped(vit: VisionTransformer, spec: PruneSpec) -> PruneSpec:
    """Stage 0 runs stage 1's predictor and stage 1 stage 0's."""
    from raggedvit.pruning.factory import policy_state, set_policy_state

    swap = {"score_predictor.0.": "score_predictor.1.", "score_predictor.1.": "score_predictor.0."}
    state = {next((swap[p] + k[len(p) :] for p in swap if k.startswith(p)), k): v for k, v in policy_state(vit).items()}
    set_policy_state(vit, state)
    return spec


def _global_half_per_token():
    """The predictor's global half is not averaged over the image's patch rows: each row keeps its own."""
    import torch.nn.functional as F

    from raggedvit.pruning.scorers import DynamicVitPredictor

    def forward(self, x, cls_attn, n, num_prefix):
        T, C = x.shape
        h = self.in_conv(x.reshape(T // n, n, C).to(self.w_local.dtype))
        y = F.linear(h, self.w_local, self.out_conv[0].bias) + F.linear(h, self.w_global)
        a = self.out_conv[3](self.out_conv[2](self.out_conv[1](y)))
        return F.linear(a, self.w_keep).reshape(T).float()

    return mock.patch.object(DynamicVitPredictor, "forward", forward)


# learned-predictor faults, validated against DYNAMICVIT_SPEC on a DynamicViT checkpoint (the base one + predictors)
DYNAMICVIT_MUTANTS = [
    Mutant("dynamicvit_predictor_weight_x1.05", _nudge_predictor, "stage 0 (block 3) kept"),
    Mutant("dynamicvit_global_half_not_averaged", _same, "stage 0 (block 3) kept", patch=_global_half_per_token),
    Mutant("dynamicvit_stages_swapped", _stages_swapped, "stage 0 (block 3) kept"),
]


def write_base_checkpoint(path: Path, seed: int = 0, *, predictor: bool = False) -> tuple[VisionTransformer, dict]:
    """Seeded deit_tiny (q/k sharpened) with random biases, norm shifts and tokens, saved to `path` (.pth) and
    loaded back from it: (vit, the recipe an export of it records as its weights and model). predictor: with seeded
    DynamicViT predictors for DYNAMICVIT_SPEC's stages, as DynamicViT saves them ({"model": ...})."""
    vit, _ = load_vit(MODEL, seed=seed)
    perturb_biases_and_norms_(vit, seed=seed)
    state = {k: v.detach().contiguous() for k, v in vit.state_dict().items()}
    if predictor:
        state = {"model": {**state, **seeded_predictor_state(vit.embed_dim, DYNAMICVIT_SPEC.num_stages, seed)}}
    torch.save(state, path)
    vit, info = load_vit(MODEL, checkpoint=path)
    return vit, {"model": MODEL, "weights": info.to_dict()}


@torch.no_grad()
def export_mutant(
    mutant: Mutant | None, vit: VisionTransformer, spec: PruneSpec, recipe: dict, path: Path, *, dtype: str = "fp32"
) -> Path:
    """Export `mutant` of (vit, spec) to `path` in `dtype`, its metadata the recipe of the unmutated model (None:
    the unmutated model itself, the control)."""
    bad_vit, bad_spec = vit, spec
    if mutant is not None:
        bad_vit = copy.deepcopy(vit)
        bad_spec = mutant.mutate(bad_vit, spec)
    with mutant.patch() if mutant is not None and mutant.patch is not None else contextlib.nullcontext():
        export_onnx(bad_vit, bad_spec, path, dtype=dtype, recipe=recipe)
    model = onnx.load(str(path))
    # the exporter records the spec it was given; put back the original's so the file hides the fault
    stored = read_recipe(model)
    write_recipe(model, {**stored, **recipe, "prune": spec.to_dict()})
    onnx.save(model, str(path))
    return path
