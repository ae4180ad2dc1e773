"""A sweep's grid: the pruning specs of one policy, from text ("keep=0.3,0.5,0.7 at=3,6,9|4") or a mapping.

The keys of a policy are `at` (PruneSpec.prune_at) and the PruneSpec fields it reads (raggedvit.policies
.POLICY_PARAMS); each value is parsed by the field's type, so a policy added there with its fields takes part
without a change here. The points are every combination of the values, in the order given.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import json
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from raggedvit import InputError
from raggedvit.policies import POLICIES, get_policy
from raggedvit.pruning.spec import PruneSpec, merged_count

__all__ = [
    "SweepInputError",
    "equal_points",
    "grid_keys",
    "grid_points",
    "parse_grid",
    "point_key",
    "point_label",
    "point_params",
]

AT = "at"  # the grid's name of PruneSpec.prune_at
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


class SweepInputError(InputError):
    """A sweep's input cannot be used (grid, images, labels, batch, settings of a resumed run): one line that says
    what and how to fix it."""


def grid_keys(policy: str) -> tuple[str, ...]:
    """The keys a grid of `policy` takes: the PruneSpec fields the policy reads, then `at` (none for "none")."""
    try:
        desc = get_policy(policy)
    except ValueError:
        raise SweepInputError(f"unknown policy {policy!r}; expected one of {', '.join(POLICIES)}") from None
    return (*desc.params, AT) if desc.prunes else ()


def _field_type(key: str) -> Any:
    return typing.get_type_hints(PruneSpec)["prune_at" if key == AT else key]


def _parse_value(policy: str, key: str, text: str) -> Any:
    kind = _field_type(key)
    word = text.strip()
    try:
        if key == AT:
            return tuple(int(p) for p in word.split(","))
        if kind is bool:
            if word.lower() not in _TRUE + _FALSE:
                raise ValueError
            return word.lower() in _TRUE
        return kind(word)
    except ValueError:
        what = "comma-separated block indices" if key == AT else f"{getattr(kind, '__name__', kind)} values"
        raise SweepInputError(f"--grid for {policy}: {key} takes {what}, got {text!r}") from None


def parse_grid(policy: str, grid: str) -> dict[str, list[Any]]:
    """'keep=0.3,0.5 at=3,6,9|4' -> {"keep": [0.3, 0.5], "at": [(3, 6, 9), (4,)]}: space-separated KEY=VALUES,
    values separated by "," (`at`: alternatives separated by "|", each a comma-separated list of block indices).
    SweepInputError for an empty grid, an unknown or repeated key, or a value of the wrong type."""
    keys = grid_keys(policy)
    if not grid.strip():
        raise SweepInputError(f"--grid for {policy} is empty; give KEY=VALUES (keys: {', '.join(keys)})")
    out: dict[str, list[Any]] = {}
    for item in grid.split():
        key, sep, values = item.partition("=")
        if not sep:
            raise SweepInputError(f"--grid for {policy}: {item!r} is not KEY=VALUES (keys: {', '.join(keys)})")
        if key not in keys:
            takes = f"takes {', '.join(keys)}" if keys else "takes no keys"
            raise SweepInputError(f"--grid for {policy}: unknown key {key!r}; {policy} {takes}")
        if key in out:
            raise SweepInputError(f"--grid for {policy}: {key} is given twice")
        parts = values.split("|") if key == AT else values.split(",")
        if not values or any(not p.strip() for p in parts):
            raise SweepInputError(f"--grid for {policy}: {key} has an empty value in {item!r}")
        out[key] = [_parse_value(policy, key, p) for p in parts]
    return out


def _spec(policy: str, values: Mapping[str, Any]) -> PruneSpec:
    """The spec of one point: PruneSpec.from_strings with the values it takes (its defaults for the others: a
    missing `at` is its default prune_at), then the remaining fields set on the result."""
    accepted = inspect.signature(PruneSpec.from_strings).parameters
    kwargs = {("prune_at" if k == AT else k): v for k, v in values.items()}
    direct = {k: v for k, v in kwargs.items() if k in accepted}
    spec = PruneSpec.from_strings(policy, **direct)
    rest = {k: v for k, v in kwargs.items() if k not in accepted}
    return dataclasses.replace(spec, **rest) if rest else spec


def grid_points(policy: str, grid: str | Mapping[str, Sequence[Any]]) -> list[PruneSpec]:
    """Every point of the grid of `policy` (text as parse_grid takes, or {key: [values]}), in order, without
    repeats. SweepInputError for a bad grid or a point PruneSpec refuses (the message names the point)."""
    if not grid_keys(policy):  # a policy without stages: one point
        return [PruneSpec()]
    if isinstance(grid, str):
        values = parse_grid(policy, grid)
    else:
        keys = grid_keys(policy)
        bad = [k for k in grid if k not in keys]
        if bad:
            raise SweepInputError(f"grid for {policy}: unknown key {bad[0]!r}; {policy} takes {', '.join(keys)}")
        values = {k: [tuple(v) if k == AT else v for v in vs] for k, vs in grid.items()}
        if not values or any(len(vs) == 0 for vs in values.values()):
            raise SweepInputError(f"grid for {policy} is empty")
    specs: list[PruneSpec] = []
    for combo in itertools.product(*values.values()):
        point = dict(zip(values, combo))
        try:
            spec = _spec(policy, point)
        except ValueError as e:
            shown = " ".join(f"{k}={_show(v)}" for k, v in point.items())
            raise SweepInputError(f"--grid for {policy}: {shown}: {e}") from None
        if spec not in specs:
            specs.append(spec)
    return specs


def _show(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value).lower() if isinstance(value, bool) else str(value)


def point_params(spec: PruneSpec) -> dict[str, Any]:
    """The grid keys of the spec's policy and their values ({"keep": 0.5, "at": [4]}; {} for none)."""
    return {k: list(spec.prune_at) if k == AT else getattr(spec, k) for k in grid_keys(spec.policy)}


def point_label(spec: PruneSpec) -> str:
    """A point's name in tables and charts: the policy's label ("topk-l2 keep=0.5 at=4", "evit keep=0.7 fuse
    at=3,6,9", "tome r=8" (every block), "none"), as the validation report prints a spec."""
    return spec.descriptor.label(spec.to_dict())


def point_key(spec: PruneSpec) -> str:
    """The identity of a point (what --resume matches): the spec as canonical JSON."""
    return json.dumps(spec.to_dict(), sort_keys=True)


def equal_points(specs: Sequence[PruneSpec], *, depth: int, tokens: int, num_prefix: int) -> dict[str, str]:
    """{key of a point: key of the earlier point of `specs` it equals} for the points that run the same model as an
    earlier one on a model of `depth` blocks and `tokens` rows per image, `num_prefix` of them prefix tokens: tome
    points whose r merges the same count in every block (merged_count: r past half the patch tokens merges that
    half, as the largest r does). The others are absent."""
    first: dict[tuple, str] = {}
    same: dict[str, str] = {}
    for spec in specs:
        if not spec.merges:
            continue
        n, merges = tokens, []
        for _ in spec.resolve(depth).prune_at:
            merges.append(merged_count(n, num_prefix, spec.r))
            n -= merges[-1]
        model = (json.dumps({**spec.to_dict(), "r": None}, sort_keys=True), tuple(merges))
        key = point_key(spec)
        if first.setdefault(model, key) != key:
            same[key] = first[model]
    return same
