"""Pruning specification: which policy, where, and how much (DESIGN.md section 4)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from raggedvit.policies import POLICIES, Policy, get_policy, static_shapes

__all__ = [
    "CLS_MASS_EPS",
    "POLICIES",
    "PruneSpec",
    "count_as_keep",
    "f32",
    "merged_count",
    "schedule_keep",
    "uniform_keep",
]

CLS_MASS_EPS = 1e-30  # floor of a row's patch-score sum before normalising (cls-mass)


def f32(value: float) -> float:
    """`value` rounded to the nearest float32 (ties to even; the precision every stage computes in).

    Plain Python arithmetic, no tensor: torch.compile folds it into a constant (a float() of a tensor would be a
    graph break). Exact for normal and subnormal float32 values; beyond the float32 range -> +-inf."""
    value = float(value)
    if value == 0.0 or not math.isfinite(value):
        return value
    exp = max(math.frexp(value)[1] - 24, -149)  # the float32 ulp of value is 2**exp (24 significant bits)
    rounded = math.ldexp(round(math.ldexp(value, -exp)), exp)  # round(): ties to even
    return rounded if abs(rounded) < 2.0**128 else math.copysign(math.inf, value)


def uniform_keep(n: int, num_prefix: int, keep: float) -> int:
    """Patch rows kept of an image with n rows by topk-l2 / evit: clamp(ceil(f32(keep) * f32(n - p)), 1, n - p).

    The float32 product is f32 of the exact product of the two float32 values (which a double holds exactly)."""
    patches = n - num_prefix
    k = math.ceil(f32(f32(keep) * f32(patches)))
    return min(max(k, 1), patches)


def schedule_keep(patches: int, keep: float, stage: int, n_patches: int) -> int:
    """Patch rows DynamicViT's stage `stage` keeps: int(patches * keep ** (stage + 1)) (its token_ratio schedule, in
    double precision as its code computes it), patches = the patch tokens before any stage, clamped to
    [1, n_patches] (the patch rows the stage sees)."""
    return min(max(int(patches * keep ** (stage + 1)), 1), n_patches)


def count_as_keep(k: int, n_patches: int) -> float:
    """A keep fraction that `uniform_keep` (and RaggedSelect's count rule, which computes it the same way) turns into
    exactly k of n_patches: the float32 nearest k / n_patches, stepped by one float32 ulp until the rule agrees."""
    import numpy as np

    value = np.float32(k / n_patches)
    for _ in range(64):
        got = uniform_keep(n_patches, 0, float(value))
        if got == k:
            return float(value)
        value = np.nextafter(value, np.float32(0 if got > k else 2), dtype=np.float32)
    raise AssertionError(f"no float32 keep gives {k} of {n_patches}")


def merged_count(n: int, num_prefix: int, r: int) -> int:
    """Tokens merged away in a tome block of an image with n rows: min(r, (n - p) // 2) (ToMe: at most half of the
    patch tokens, the size of the smaller of the alternating sets A and B)."""
    return max(min(r, (n - num_prefix) // 2), 0)


@dataclass(frozen=True)
class PruneSpec:
    """A token pruning schedule.

    Attributes:
        policy: "none" (no stages), "topk-l2", "evit", "cls-mass" or "tome" (token merging).
        prune_at: block indices, strictly increasing. A "between" policy's stage "at i" runs after blocks 0..i-1
            (indices 1..depth-1: topk-l2, cls-mass, dynamicvit). An "inside" policy's stage at i runs inside block
            i, between its attention and its MLP (indices 0..depth-1): evit (EViT's drop_loc) and tome (the blocks
            that merge; () means every block, `resolve(depth)` makes that explicit). Always () for policy "none".
        keep: fraction of patch tokens kept per stage (topk-l2, evit: ceil(keep * patches)), in (0, 1]; dynamicvit:
            its rho (stage s keeps int(P * rho^(s+1)) of the P patch tokens before any stage).
        mass: cumulative normalised cls attention kept per stage (cls-mass), in (0, 1].
        fuse: evit only: append one token per image, the sum of the dropped tokens weighted by their class
            attention (EViT's fuse_token).
        r: tome only (>= 1): tokens merged away per merging block and image (at most half of the patch tokens:
            `merged_count`); 0 for the other policies.
    """

    policy: str = "none"
    prune_at: tuple[int, ...] = ()
    keep: float = 0.5
    mass: float = 0.9
    fuse: bool = False
    r: int = 0

    def __post_init__(self) -> None:
        desc = get_policy(self.policy)  # ValueError naming the known policies
        if not desc.prunes:
            object.__setattr__(self, "prune_at", ())
        object.__setattr__(self, "prune_at", tuple(int(i) for i in self.prune_at))
        merging = desc.merges
        inside = desc.where == "inside"
        if desc.prunes and not self.prune_at and desc.default_at != "every":
            raise ValueError(f"policy {self.policy!r} needs at least one prune index (prune_at)")
        if any(b <= a for a, b in zip(self.prune_at, self.prune_at[1:])):
            raise ValueError(f"prune indices must be strictly increasing, got {list(self.prune_at)}")
        if inside and any(i < 0 for i in self.prune_at):
            raise ValueError(
                f"{self.policy} block indices must be >= 0 (its stages run inside a block), got {list(self.prune_at)}"
            )
        if not inside and any(i < 1 for i in self.prune_at):
            raise ValueError(f"prune indices must be >= 1 (a stage runs after a block), got {list(self.prune_at)}")
        if isinstance(self.r, bool) or int(self.r) != self.r:
            raise ValueError(f"r must be an integer, got {self.r!r}")
        object.__setattr__(self, "r", int(self.r))
        if merging and self.r < 1:
            raise ValueError(f"policy 'tome' needs r >= 1 (tokens merged per block), got r={self.r}")
        if not merging and self.r != 0:
            raise ValueError(f"r (tokens merged per block) is only defined for policy 'tome', not {self.policy!r}")
        if not (math.isfinite(self.keep) and 0.0 < self.keep <= 1.0):
            raise ValueError(f"keep must be in (0, 1], got {self.keep}")
        if not (math.isfinite(self.mass) and 0.0 < self.mass <= 1.0):
            raise ValueError(f"mass must be in (0, 1], got {self.mass}")
        if self.fuse and "fuse" not in desc.params:
            raise ValueError(f"fuse is only defined for policy 'evit', not {self.policy!r}")

    @property
    def num_stages(self) -> int:
        """Stages of the spec (tome with prune_at () has one per block: `resolve(depth)` first)."""
        return len(self.prune_at)

    @property
    def descriptor(self) -> Policy:
        """The policy's descriptor (raggedvit.policies): what it scores, how it cuts, where its stages run."""
        return get_policy(self.policy)

    @property
    def merges(self) -> bool:
        """Token merging (tome): each stage merges inside its block instead of selecting rows before it."""
        return self.descriptor.merges

    def resolve(self, depth: int) -> PruneSpec:
        """This spec for a model of `depth` blocks: tome's prune_at () (every block) becomes (0, ..., depth-1); any
        other spec is returned as is."""
        if self.merges and not self.prune_at:
            return PruneSpec(self.policy, tuple(range(depth)), self.keep, self.mass, self.fuse, self.r)
        return self

    def stage_keep(self, stage: int, n: int, num_prefix: int, patches: int) -> int:
        """Patch rows stage `stage` keeps of an image with n rows, for a policy whose counts are known before the
        data: ceil(keep * (n - p)) ("count": in float32, `uniform_keep`, or in double precision for EViT's
        exact_count), or DynamicViT's int(patches * keep^(stage+1)) ("schedule", patches: the patch tokens before
        any stage)."""
        desc = self.descriptor
        if desc.cut == "schedule":
            return schedule_keep(patches, self.keep, stage, n - num_prefix)
        if desc.exact_count:  # EViT: math.ceil(keep_rate * (N - 1)) on Python floats
            return min(max(math.ceil(self.keep * (n - num_prefix)), 1), n - num_prefix)
        return uniform_keep(n, num_prefix, self.keep)

    def count_keep(self, k: int, n: int, num_prefix: int) -> float | None:
        """The keep fraction a count rule (RaggedSelect's, select_tokens') must be given for k of n - p patch rows:
        None where the spec's own keep yields k by the float32 rule (`uniform_keep`), else the fraction that does
        (`count_as_keep`: a schedule's count, or EViT's double-precision ceil where keep * patches is whole)."""
        return None if k == uniform_keep(n, num_prefix, self.keep) else count_as_keep(k, n - num_prefix)

    @property
    def needs_cls_attn(self) -> bool:
        return self.descriptor.needs_cls_attn

    @property
    def static_shapes(self) -> bool:
        """Every stage keeps a count known before the data (topk-l2, evit without fuse, none): PrunedViT runs
        them as uniform stages, and its traced graph has static shapes at a given batch size (no NonZero) and
        runs as a CUDA graph in either layout. Other policies need the capacity layout for that
        (`raggedvit.policies.static_shapes(policy, fuse, capacity=True)`)."""
        return static_shapes(self.policy, self.fuse)

    @classmethod
    def from_strings(
        cls,
        policy: str,
        prune_at: str | int | tuple[int, ...] | None = None,
        keep: float | str = 0.5,
        mass: float | str = 0.9,
        fuse: bool = False,
        *,
        r: int | str = 0,
        depth: int | None = None,
        has_class_token: bool | None = None,
    ) -> PruneSpec:
        """Parse CLI-style values, e.g. `from_strings("evit", "4,7", keep="0.7")`, `from_strings("tome", "", r=8)`
        (every block).

        `depth` / `has_class_token` (when given) check the spec against a model too. prune_at None: "4" (a stage
        before block 4), every block for tome.
        """
        if prune_at is None:
            default = get_policy(policy).default_at
            prune_at = "" if default == "every" else default
        if isinstance(prune_at, str):
            parts = [p.strip() for p in prune_at.replace(";", ",").split(",") if p.strip()]
            try:
                indices = tuple(int(p) for p in parts)
            except ValueError:
                raise ValueError(f"prune_at must be comma-separated block indices, got {prune_at!r}") from None
        elif isinstance(prune_at, int):
            indices = (prune_at,)
        else:
            indices = tuple(int(i) for i in prune_at)
        try:
            keep_f, mass_f = float(keep), float(mass)
        except ValueError:
            raise ValueError(f"keep and mass must be numbers, got keep={keep!r} mass={mass!r}") from None
        try:
            r_i = int(r)
        except ValueError:
            raise ValueError(f"r must be an integer, got r={r!r}") from None
        spec = cls(policy=policy, prune_at=indices, keep=keep_f, mass=mass_f, fuse=bool(fuse), r=r_i)
        if depth is not None or has_class_token is not None:
            spec.check_model(depth=depth, has_class_token=has_class_token)
        return spec

    def check_model(self, *, depth: int | None, has_class_token: bool | None) -> None:
        """Raise ValueError if the spec cannot run on a model of `depth` blocks / without a class token."""
        if depth is not None:
            inside = self.descriptor.where == "inside"
            lo = 0 if inside else 1
            bad = [i for i in self.prune_at if not lo <= i <= depth - 1]
            if bad:
                what = f"{self.policy} block index" if inside else "prune index"
                raise ValueError(f"{what} {bad[0]} out of range {lo}..{depth - 1} for a model with {depth} blocks")
        if has_class_token is False and self.needs_cls_attn:
            raise ValueError(
                f"policy {self.policy!r} needs a class token in the pruned blocks (it ranks tokens by the class "
                "token's attention); the model has none there: use topk-l2"
            )

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON values; "r" only for tome; "placement": "inside" for evit, whose stages moved inside
        their blocks (EViT's placement): it tells a recipe of this meaning from an older one (`from_dict`)."""
        data: dict[str, Any] = {
            "policy": self.policy,
            "prune_at": list(self.prune_at),
            "keep": self.keep,
            "mass": self.mass,
            "fuse": self.fuse,
        }
        if self.merges:
            data["r"] = self.r
        elif self.descriptor.where == "inside":
            data["placement"] = "inside"
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PruneSpec:
        known = {"policy", "prune_at", "keep", "mass", "fuse", "r", "placement"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown PruneSpec fields {unknown}")
        desc = get_policy(str(data.get("policy", "none")))
        if desc.where == "inside" and not desc.merges and data.get("placement") != "inside":
            raise ValueError(
                f"an {desc.name} spec written before its stages ran inside their blocks (EViT's placement; they ran "
                "before block i, ranked by block i-1's attention): re-export the model with this raggedvit"
            )
        return cls(
            policy=str(data.get("policy", "none")),
            prune_at=tuple(int(i) for i in data.get("prune_at", ())),
            keep=float(data.get("keep", 0.5)),
            mass=float(data.get("mass", 0.9)),
            fuse=bool(data.get("fuse", False)),
            r=int(data.get("r", 0)),
        )
