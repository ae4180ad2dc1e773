"""What `python3 -m benchmarks.serving` measures: variant names, policies, the speed bars, HBM bandwidths.

No heavy imports: the report reads these without torch.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "timm_name",
    "BANDWIDTH_SOURCE",
    "BARS",
    "BASELINE",
    "COMPILED",
    "CUDA_ONLY",
    "DEFAULT_POLICIES",
    "ENGINE",
    "ENGINE_PAIRS",
    "ENGINE_TARGETS",
    "HBM_BANDWIDTH",
    "ORT",
    "ORT_ENGINE",
    "PRUNED",
    "UNPRUNED",
    "VARIANTS",
    "Bar",
    "EngineTarget",
    "split_linear",
    "table_bandwidth",
]

# unpruned (policy "none"): timm's model eager, torch.compile(mode="reduce-overhead"), raggedvit's policy-none export,
# the block engine in torch, the block engine's policy-none export
UNPRUNED = ("timm_eager", "timm_compile", "ort_unpruned", "engine_unpruned", "ort_engine_unpruned")
# per pruning policy: PrunedViT eager, PrunedViT under torch.compile(mode="reduce-overhead"), raggedvit's export,
# the block engine in torch, the block engine's export
PRUNED = ("prunedvit_eager", "prunedvit_compile", "ort_raggedvit", "engine", "ort_engine")
VARIANTS = UNPRUNED + PRUNED
# PrunedViT(engine="block", capacity=True) in the export recipe's dtypes (precision.apply_dtype), one
# torch.cuda.CUDAGraph per batch (eager on CPU: the block op's reference kernel)
ENGINE = ("engine_unpruned", "engine")
# raggedvit's exports with engine="block" (one com.raggedvit::RaggedViTBlock node per block; the CUDA EP kernel is
# the AOT block engine): run as the other exports, but never with a block placed on the CPU EP on CUDA
ORT_ENGINE = ("ort_engine_unpruned", "ort_engine")
COMPILED = ("timm_compile", "prunedvit_compile")
# raggedvit's exports in ONNX Runtime: a CUDA graph when the export has static shapes, else node by node
ORT = ("ort_unpruned", "ort_raggedvit", *ORT_ENGINE)
CUDA_ONLY = COMPILED  # mode="reduce-overhead" is CUDA graphs; the CPU debug run skips them
BASELINE = "timm_compile"  # the bars' denominator: torch.compile unpruned

DEFAULT_POLICIES = ("topk-l2:keep=0.5:at=4", "cls-mass:mass=0.9:at=3,6,9")
LINEAR_FLAG = "linear"  # a policy string ending in ":linear": PrunedViT(ragged_linear=True) and its export
DEAD_LINEAR_FLAG = "dead-linear"  # ":dead-linear": ragged_linear="dead-rows" (only the blocks with dead rows)


def split_linear(policy: str) -> tuple[str, bool | str]:
    """'cls-mass:mass=0.9:at=3,6,9:linear' -> ('cls-mass:mass=0.9:at=3,6,9', True): the pruning policy, and
    PrunedViT's `ragged_linear` (True: every block GEMM in raggedvit's ragged linear op, dead rows skipped,
    epilogues fused; ':dead-linear' -> "dead-rows": only in the blocks with dead rows; else False)."""
    head, _, last = policy.rpartition(":")
    if head and last == LINEAR_FLAG:
        return head, True
    if head and last == DEAD_LINEAR_FLAG:
        return head, "dead-rows"
    return policy, False


@dataclass(frozen=True)
class Bar:
    """One speed bar: `variant` of policies named `policy` at `batches` reaches `min_ratio` x the
    img/s of BASELINE on the same model and batch; `mode` (when set) must be the variant's run mode."""

    policy: str  # policy name (the part of the policy string before the first ':')
    variant: str
    batches: tuple[int, ...]
    min_ratio: float
    mode: str | None = None

    @property
    def text(self) -> str:
        how = f" as a {self.mode.replace('_', ' ')}" if self.mode else ""
        bs = ",".join(str(b) for b in self.batches)
        return f"{self.policy} {self.variant}{how} >= {self.min_ratio}x {BASELINE} at B={bs}"


# the serving speed bars: ratios against torch.compile unpruned (mode="reduce-overhead")
BARS = (
    Bar("topk-l2", "ort_raggedvit", (1, 4), 2.0),
    Bar("topk-l2", "ort_raggedvit", (32, 128), 1.6),
    Bar("cls-mass", "ort_raggedvit", (1, 4), 1.5, mode="cuda_graph"),
    Bar("cls-mass", "ort_raggedvit", (32, 128), 2.0, mode="cuda_graph"),
)


@dataclass(frozen=True)
class EngineTarget:
    """One target of the block engine, judged per model, policy and batch of the run on the records of `variant`
    (each pruning policy of the run; "none" for an unpruned variant).

    `metric`: "gpu_us" (profiled GPU time per forward, gpu_us_per_forward) or "wall" (host-timed ms_per_batch).
    Without `against` the value is the metric itself, met when <= `limit`. With `against` (same model and batch;
    policy "none" when `against` is unpruned, else the same policy): value = variant's metric / against's, met when
    <= `limit`; with `speedup` value = against's / variant's, met when >= `limit`. `models`: short or timm names the
    target applies to (None: every model)."""

    variant: str
    metric: str
    limit: float
    batches: tuple[int, ...]
    against: str | None = None
    speedup: bool = False
    models: tuple[str, ...] | None = None

    @property
    def text(self) -> str:
        who = f"{'/'.join(self.models)} " if self.models else ""
        what = {"gpu_us": "GPU time per forward", "wall": "wall time"}[self.metric]
        bs = ",".join(str(b) for b in self.batches)
        if self.against is None:
            return f"{who}{self.variant} {what} <= {self.limit:g} us at B={bs}"
        rel = f">= {self.limit:g}x faster than" if self.speedup else f"<= {self.limit:g}x"
        return f"{who}{self.variant} {what} {rel} {self.against} at B={bs}"


def _engine_targets(engine: str, unpruned: str) -> tuple[EngineTarget, ...]:
    """The block engine's targets for one pair of its variants: `engine` (pruned) and `unpruned` (policy none)."""
    return (
        EngineTarget(engine, "gpu_us", 150.0, (1,), models=("deit_base",)),
        EngineTarget(engine, "gpu_us", 250.0, (4,), models=("deit_base",)),
        EngineTarget(engine, "gpu_us", 80.0, (1,), models=("deit_small",)),
        EngineTarget(engine, "gpu_us", 0.75, (1, 4), against=unpruned),  # pruning pays at small batches
        EngineTarget(engine, "wall", 3.0, (1,), against=BASELINE, speedup=True),
        EngineTarget(engine, "wall", 2.5, (4,), against=BASELINE, speedup=True),
        EngineTarget(engine, "gpu_us", 1.0, (32, 128), against="ort_raggedvit"),  # no large batch slower than export
        EngineTarget(unpruned, "gpu_us", 1.0, (32, 128), against="ort_unpruned"),
    )


# the block engine's targets (GPU time is compared across runs; wall time at B=1 moves with the host), judged on the
# engine in torch (PrunedViT(engine="block") as a CUDA graph) and on its ONNX export (--engine block in ORT: the
# product path), each pruned variant against its own unpruned one
ENGINE_PAIRS = {"engine": "engine_unpruned", "ort_engine": "ort_engine_unpruned"}
ENGINE_TARGETS = tuple(t for engine, unpruned in ENGINE_PAIRS.items() for t in _engine_targets(engine, unpruned))

# peak HBM bandwidth in bytes/s by GPU name (torch.cuda.get_device_name), from the vendors' datasheets
HBM_BANDWIDTH = {
    "H200": 4.8e12,  # NVIDIA H200 datasheet: 141 GB HBM3e at 4.8 TB/s
    "H100 80GB HBM3": 3.35e12,  # NVIDIA H100 SXM datasheet: 3.35 TB/s
    "H100 PCIe": 2.0e12,  # NVIDIA H100 PCIe datasheet: 2.0 TB/s
    "A100-SXM4-80GB": 2.039e12,  # NVIDIA A100 datasheet: 80 GB HBM2e SXM, 2,039 GB/s
}
BANDWIDTH_SOURCE = "NVIDIA datasheets (H200: 141 GB HBM3e, 4.8 TB/s)"


def table_bandwidth(gpu_name: str | None) -> float | None:
    """Peak HBM bytes/s of `gpu_name` from HBM_BANDWIDTH (the longest key contained in the name), or None."""
    if not gpu_name:
        return None
    hits = [k for k in HBM_BANDWIDTH if k in gpu_name]
    return HBM_BANDWIDTH[max(hits, key=len)] if hits else None


def timm_name(model: str) -> str:
    """A short name `deit_base` -> `deit_base_patch16_224`; a name with `_patch` in it is a timm name already."""
    return model if "_patch" in model else f"{model}_patch16_224"
