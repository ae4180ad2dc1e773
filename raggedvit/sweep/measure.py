"""One point of a sweep: its accuracy side (PrunedViT in PyTorch against the unpruned forward) and its speed side
(the export in ONNX Runtime, timed with raggedvit.timing.bench). DESIGN.md section 7 says what each number measures."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from raggedvit.pruning import PruneSpec, build_pruned_vit
from raggedvit.pruning.backbone import Backbone
from raggedvit.pruning.flops import image_flops, unpruned_flops
from raggedvit.sweep.inputs import SweepImages

__all__ = ["Reference", "measure_accuracy", "measure_speed", "reference"]


@dataclass(frozen=True)
class Reference:
    """The unpruned forward (PrunedViT with policy none) of every image: log_probs [N, classes] float32 (CPU)."""

    log_probs: torch.Tensor

    @property
    def top1(self) -> torch.Tensor:
        """[N] int64 class predicted by the unpruned model."""
        return self.log_probs.argmax(dim=1)


def _forward(vit: torch.nn.Module, spec: PruneSpec, images: SweepImages, batch: int, device: str):
    """(logits [N, classes] float32 CPU, token_counts [N, stages] int64 CPU) of PrunedViT(vit, spec)."""
    model = build_pruned_vit(vit, spec).eval()
    logits, counts = [], []
    with torch.inference_mode():
        for _, x in images.batches(vit, batch):
            out = model(x.to(device))
            logits.append(out.logits.float().cpu())
            counts.append(out.token_counts.cpu())
    return torch.cat(logits), torch.cat(counts)


def reference(vit: torch.nn.Module, images: SweepImages, *, batch: int, device: str) -> Reference:
    """The unpruned model's outputs on `images` (vit on `device`)."""
    logits, _ = _forward(vit, PruneSpec(), images, batch, device)
    return Reference(torch.log_softmax(logits, dim=1))


def measure_accuracy(
    vit: torch.nn.Module,
    backbone: Backbone,
    spec: PruneSpec,
    images: SweepImages,
    ref: Reference,
    *,
    batch: int,
    device: str,
) -> dict[str, Any]:
    """The accuracy side of one point: agreement (top-1 equal to the unpruned model's), top1 / top5 (fraction of
    images whose label is the first / among the first five classes; None without labels), kl (mean KL divergence
    of the pruned softmax from the unpruned one, nats), tokens (mean tokens per image after each stage), gflops
    (mean per image, raggedvit.pruning.flops) and flops_ratio (to the unpruned forward)."""
    logits, counts = _forward(vit, spec, images, batch, device)
    log_q = torch.log_softmax(logits, dim=1)
    p = ref.log_probs.exp()
    terms = torch.where(p > 0, p * (ref.log_probs - log_q), 0.0)  # a class of probability 0 adds 0
    kl = terms.sum(dim=1)  # KL(unpruned || pruned) per image
    top1 = top5 = None
    if images.labels is not None:
        labels = torch.tensor(images.labels)
        top = logits.topk(min(5, logits.shape[1]), dim=1).indices
        top1 = float((top[:, 0] == labels).double().mean())
        top5 = float((top == labels[:, None]).any(dim=1).double().mean())
    # tome: one stage per merging block (every block for prune_at ()), each inside its block, after the attention
    flops = image_flops(backbone, spec.resolve(backbone.depth).prune_at, counts, inside=spec.merges)
    return {
        "agreement": float((logits.argmax(dim=1) == ref.top1).double().mean()),
        "top1": top1,
        "top5": top5,
        "kl": float(kl.double().mean()),
        "tokens": [float(c) for c in counts.double().mean(dim=0)],
        "gflops": float(flops.mean()) / 1e9,
        "flops_ratio": float(flops.mean()) / unpruned_flops(backbone),
    }


def measure_speed(
    vit: torch.nn.Module,
    spec: PruneSpec,
    inputs: torch.Tensor,
    workdir: Path,
    *,
    recipe: dict[str, Any],
    dtype: str,
    capacity: bool,
    device: str,
    batch: int,
    seconds: float,
) -> dict[str, Any]:
    """The speed side of one point: export to `workdir` (raggedvit.exporter.export_onnx), then img/s at `batch`
    in ONNX Runtime on `device` (raggedvit.timing.bench.bench_onnx on `inputs` [n, 3, S, S] tiled to the batch): as
    a CUDA graph where the shapes are static, with the GPU time of one run on CUDA. The export file is removed."""
    from raggedvit.exporter import export_onnx
    from raggedvit.policies import static_shapes
    from raggedvit.timing.bench import bench_onnx

    path = workdir / "point.onnx"
    export_onnx(vit, spec, path, dtype=dtype, recipe=recipe, capacity=capacity)
    cuda_graph = device == "cuda" and static_shapes(spec.policy, spec.fuse, capacity)
    try:
        (r,) = bench_onnx(
            path,
            device=device,
            batches=(batch,),
            seconds=seconds,
            cuda_graph=cuda_graph,
            images=inputs,
            gpu_time=device == "cuda",
        )
    finally:
        for f in workdir.iterdir():
            shutil.rmtree(f) if f.is_dir() and not f.is_symlink() else f.unlink()
    return {
        "img_per_s": r.img_per_s,
        "latency_ms": r.latency_ms,
        "p10_ms": r.p10_ms,
        "p90_ms": r.p90_ms,
        "gpu_ms": r.gpu_ms,
        "runs": r.runs,
        "cuda_graph": cuda_graph,
    }
