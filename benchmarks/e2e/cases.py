"""What benchmarks.e2e runs: model/size cases, pruning policies, variant names, and the run configuration."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from benchmarks.e2e.names import BASELINES, CUDA_ONLY, GRAPH, ISSUE_BASELINES, OURS, PRUNED, VARIANTS
from raggedvit.pruning import PruneSpec

__all__ = [
    "BASELINES",
    "CUDA_ONLY",
    "DEFAULT_POLICIES",
    "GRAPH",
    "ISSUE_BASELINES",
    "OURS",
    "PRUNED",
    "VARIANTS",
    "BenchConfig",
    "ModelCase",
    "parse_policy",
    "resolve_case",
]

DEFAULT_POLICIES = ("topk-l2:keep=0.5:at=4", "cls-mass:mass=0.9:at=3,6,9")


def blank_record(model: str, img_size: int, policy: str, variant: str, batch: int, status: str) -> dict[str, Any]:
    """One benchmark record with every measured field empty (the runner fills them; errors keep them None)."""
    return {
        "model": model,
        "img_size": img_size,
        "policy": policy,
        "variant": variant,
        "batch": batch,
        "latency_ms": None,
        "img_per_s": None,
        "mean_tokens": None,
        "top1_agree": None,
        "top1_ref": None,
        "runs": None,
        "status": status,
        "note": "",
        "error": None,
    }


def parse_policy(text: str) -> PruneSpec:
    """'topk-l2:keep=0.5:at=4' / 'cls-mass:mass=0.9:at=3,6,9' / 'evit:keep=0.7:at=4,7:fuse' / 'tome:r=8' (every
    block; 'tome:r=8:at=0,1,2' merges in those blocks) -> PruneSpec."""
    name, *parts = text.split(":")
    kw: dict[str, Any] = {"prune_at": "" if name == "tome" else "4"}
    for part in parts:
        key, _, value = part.partition("=")
        if key == "at":
            kw["prune_at"] = value
        elif key in ("keep", "mass", "r"):
            kw[key] = value
        elif key == "fuse" and not value:
            kw["fuse"] = True
        else:
            raise ValueError(f"policy {text!r}: unknown field {part!r} (expected at=, keep=, mass=, r=, fuse)")
    if name == "none":
        raise ValueError("policy 'none' is the unpruned baselines; list pruning policies only")
    return PruneSpec.from_strings(name, **kw)


@dataclass(frozen=True)
class ModelCase:
    """One model at one resolution: `model` is the short name (deit_small), `timm_name` what load_vit builds."""

    model: str
    img_size: int
    timm_name: str
    img_size_arg: int | None  # passed to load_vit(img_size=...) when the timm name is not already at img_size

    @property
    def key(self) -> str:
        return f"{self.model}_{self.img_size}"


def resolve_case(model: str, img_size: int) -> ModelCase:
    """deit_base @ 384 -> deit_base_patch16_384; deit_small @ 384 -> deit_small_patch16_224 with img_size=384."""
    import timm

    native = f"{model}_patch16_{img_size}"
    if timm.is_model(native):
        return ModelCase(model, img_size, native, None)
    base = f"{model}_patch16_224"
    if not timm.is_model(base):
        raise ValueError(f"no timm model {native!r} or {base!r}")
    return ModelCase(model, img_size, base, img_size)


@dataclass
class BenchConfig:
    device: str = "cuda"
    dtype: str = "fp16"  # torch compute dtype and raggedvit export dtype ("fp32" on the CPU debug run)
    export_dtype: str | None = None  # raggedvit export recipe when not `dtype` (e.g. "fp16-all")
    models: tuple[str, ...] = ("deit_small", "deit_base")
    sizes: tuple[int, ...] = (224, 384)
    batches: tuple[int, ...] = (1, 4, 32, 128)
    policies: tuple[str, ...] = DEFAULT_POLICIES
    variants: tuple[str, ...] = VARIANTS
    target_s: float = 0.3
    warmup_s: float = 0.2
    min_warmup: int = 3
    min_runs: int = 5
    time_budget_s: float = 400.0
    profile_case: tuple[str, int] | None = ("deit_base", 224)
    profile_batches: tuple[int, ...] = (1, 32)
    model_kwargs: dict[str, Any] = field(default_factory=dict)  # extra timm kwargs (CPU debug: depth)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BenchConfig:
        tuples = ("models", "sizes", "batches", "policies", "variants", "profile_batches", "profile_case")
        kw = {k: (tuple(v) if k in tuples and v is not None else v) for k, v in d.items()}
        return cls(**kw)
