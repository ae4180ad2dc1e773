"""The one factory of PrunedViT: a model, a spec, and the pruning state its checkpoint carried.

A learned policy (DynamicViT) has weights of its own, saved in the same checkpoint as the backbone under the
policy's key prefix (`Policy.state_prefix`: `score_predictor.{stage}.…`). `raggedvit.weights.load_vit` sets those
keys apart from the backbone's and keeps them with the model (`policy_state`); `build_pruned_vit` loads them into
the stages' scorers, checked strictly, so that the exporter, the validators, the sweep and coverage, which all build
PrunedViT here, run the same predictor.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from raggedvit import InputError
from raggedvit.pruning.families import backbone_for
from raggedvit.pruning.packed import PrunedViT
from raggedvit.pruning.scorers import scorer_for
from raggedvit.pruning.spec import PruneSpec

__all__ = [
    "POLICY_STATE_ATTR",
    "PolicyStateError",
    "build_pruned_vit",
    "ignored_policy_state",
    "policy_state",
    "set_policy_state",
]

POLICY_STATE_ATTR = "raggedvit_policy_state"  # the attribute of a timm model that holds its checkpoint's policy keys


class PolicyStateError(InputError):
    """A learned policy's weights are missing from the checkpoint, or do not fit the model; the message names the
    keys."""


def set_policy_state(model: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Keep a checkpoint's pruning-policy keys (under a learned policy's prefix) with its model."""
    setattr(model, POLICY_STATE_ATTR, dict(state))


def policy_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The pruning-policy keys the model's checkpoint carried ({} for none)."""
    return dict(getattr(model, POLICY_STATE_ATTR, None) or {})


def _learned_scorers(spec: PruneSpec, width: int, state: Mapping[str, torch.Tensor]) -> nn.ModuleList:
    """The stages' predictors of a learned policy, loaded strictly from `state` (stage s under prefix + "s.")."""
    desc = spec.descriptor
    scorers = nn.ModuleList(scorer_for(desc, width) for _ in spec.prune_at)
    missing: list[str] = []
    for s, scorer in enumerate(scorers):
        prefix = f"{desc.state_prefix}{s}."
        want = scorer.state_dict()
        got = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
        missing += [prefix + k for k in want if k not in got]
        if missing:
            continue
        bad = [f"{prefix}{k} {tuple(got[k].shape)} (the model needs {tuple(v.shape)})" for k, v in want.items()
               if tuple(got[k].shape) != tuple(v.shape)]  # fmt: skip
        if bad:
            raise PolicyStateError(f"policy {spec.policy!r}: predictor weights do not fit the model: {'; '.join(bad)}")
        scorer.load_state_dict({k: got[k].float() for k in want})
    if missing:
        more = f" and {len(missing) - 6} more" if len(missing) > 6 else ""
        raise PolicyStateError(
            f"policy {spec.policy!r} needs its predictor weights in the checkpoint ({spec.num_stages} stages under "
            f"'{desc.state_prefix}<stage>.'); missing: {', '.join(missing[:6])}{more}"
        )
    stage_of = {k: k[len(desc.state_prefix) :].split(".", 1)[0] for k in state if k.startswith(desc.state_prefix)}
    extra = sorted(k for k, s in stage_of.items() if not s.isdigit() or int(s) >= spec.num_stages)
    if extra:
        raise PolicyStateError(
            f"policy {spec.policy!r} runs {spec.num_stages} stages (prune_at {list(spec.prune_at)}); the checkpoint "
            f"has predictor keys of no stage: {', '.join(extra[:4])}"
        )
    return scorers


def build_pruned_vit(
    vit: nn.Module, spec: PruneSpec, *, state: Mapping[str, torch.Tensor] | None = None, **options
) -> PrunedViT:
    """PrunedViT(vit, spec, **options) with the stages' scorers: parameter-free ones, or a learned policy's
    predictors loaded from `state` (default: the keys the model's checkpoint carried, `policy_state(vit)`).
    PolicyStateError (an InputError) names missing or misshaped predictor keys. A policy without weights ignores
    the state (the caller says so: `ignored_policy_state`)."""
    backbone = backbone_for(vit)
    spec = spec.resolve(backbone.depth)
    scorers = None
    if spec.descriptor.learned:
        scorers = _learned_scorers(spec, backbone.width, policy_state(vit) if state is None else state)
    return PrunedViT(vit, spec, scorers=scorers, **options)


def ignored_policy_state(vit: nn.Module, spec: PruneSpec) -> list[str]:
    """The checkpoint's pruning-policy keys that `spec` does not use (a DynamicViT checkpoint under another policy:
    its backbone loads, its predictor is ignored)."""
    return [] if spec.descriptor.learned else sorted(policy_state(vit))
