"""What `python3 -m benchmarks.serving` measures: variant names, policies, the speed bars, HBM bandwidths.

No heavy imports: the report reads these without torch.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "timm_name",
    "matched_topk",
    "tome_tokens",
    "TOME_POLICIES",
    "BANDWIDTH_SOURCE",
    "BARS",
    "BASELINE",
    "COMPILED",
    "CUDA_ONLY",
    "DEFAULT_POLICIES",
    "HBM_BANDWIDTH",
    "ORT",
    "PRUNED",
    "UNPRUNED",
    "VARIANTS",
    "Bar",
    "split_linear",
    "table_bandwidth",
]

# unpruned (policy "none"): timm's model eager, torch.compile(mode="reduce-overhead"), raggedvit's policy-none export
UNPRUNED = ("timm_eager", "timm_compile", "ort_unpruned")
# per pruning policy: PrunedViT eager, PrunedViT under torch.compile(mode="reduce-overhead"), raggedvit's export
PRUNED = ("prunedvit_eager", "prunedvit_compile", "ort_raggedvit")
VARIANTS = UNPRUNED + PRUNED
COMPILED = ("timm_compile", "prunedvit_compile")
ORT = ("ort_unpruned", "ort_raggedvit")  # CUDA graph when the export has static shapes, else node by node
CUDA_ONLY = COMPILED  # mode="reduce-overhead" is CUDA graphs; the CPU debug run skips them
BASELINE = "timm_compile"  # the bars' denominator: torch.compile unpruned

DEFAULT_POLICIES = ("topk-l2:keep=0.5:at=4", "cls-mass:mass=0.9:at=3,6,9")


def tome_tokens(tokens: int, num_prefix: int, r: int, blocks: int) -> int:
    """Tokens per image after `blocks` tome blocks merging `r` each (raggedvit.pruning.spec.merged_count: at most half
    of the patch tokens per block)."""
    for _ in range(blocks):
        tokens -= max(min(r, (tokens - num_prefix) // 2), 0)
    return tokens


def matched_topk(tokens: int, num_prefix: int, final: int, at: int = 4) -> str:
    """The topk-l2 policy string that keeps `final` tokens per image (prefix included) from one stage at block `at`:
    keep = (patches kept - 0.5) / patches, so ceil(f32(keep) * patches) is exactly the patches kept."""
    patches, kept = tokens - num_prefix, final - num_prefix
    return f"topk-l2:keep={(kept - 0.5) / patches:.6f}:at={at}"


# `--tome`: ToMe with r = 8 and r = 16 in every block of deit_base / deit_small (197 tokens, a class token, 12
# blocks), and topk-l2 at block 4 keeping the same final token count (101 and 11 tokens per image)
TOME_POLICIES = tuple(p for r in (8, 16) for p in (f"tome:r={r}", matched_topk(197, 1, tome_tokens(197, 1, r, 12))))
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
