"""The serving benchmark's run configuration (JSON round trip: the result file records it)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from benchmarks.serving.names import DEFAULT_POLICIES, VARIANTS

__all__ = ["ServingConfig"]


@dataclass
class ServingConfig:
    device: str = "cuda"
    dtype: str = "fp16"  # torch variants' dtype ("fp32" on the CPU debug run)
    export_dtype: str = "fp16-all"  # raggedvit export recipe of ort_unpruned and ort_raggedvit
    models: tuple[str, ...] = ("deit_base", "deit_small")  # short names: <name>_patch16_224 in timm
    batches: tuple[int, ...] = (1, 4, 32, 128)
    policies: tuple[str, ...] = DEFAULT_POLICIES
    variants: tuple[str, ...] = VARIANTS
    rounds: int = 3  # timing rounds per batch, variants interleaved (order reversed every other round)
    seconds: float = 0.12  # timed seconds per variant per round (raggedvit.timing.measure target_s)
    min_runs: int = 5
    profile_forwards: int = 5  # forwards traced per variant and batch for kernel counts and GPU time
    top_kernels: int = 8  # kernels by GPU time kept per record (the per-kernel breakdown)
    compile_dynamic: bool | None = None  # torch.compile(dynamic=...): None = dynamo's default (automatic dynamic)
    export_workers: int = 6  # processes making the exports while the GPU work starts (0: in this process)
    time_budget_s: float = 230.0
    cupti_warmup: bool = False  # an empty torch.profiler session before any CUDA graph is captured
    model_kwargs: dict[str, Any] = field(default_factory=dict)  # extra timm kwargs (debug: depth)

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}
