"""Throughput of an exported model in ONNX Runtime (the library behind `raggedvit bench`).

Inputs are the sample photos through the recipe model's timm eval transform (raggedvit.images.sample_inputs; seeded
noise only when asked for), tiled to each batch size and bound where the session runs (GPU io binding on CUDA).
Timing is raggedvit.timing.measure, the benchmarks' loop: host wall time of synchronized runs after a warm-up.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

__all__ = ["BenchResult", "bench_inputs", "bench_onnx", "plot_results"]


@dataclass(frozen=True)
class BenchResult:
    """One batch size: latency of a session run (median, p10, p90 over `runs`) and the images per second of the
    median."""

    batch: int
    latency_ms: float
    img_per_s: float
    runs: int
    mean_tokens: list[float]  # mean kept tokens per image after each pruning stage
    p10_ms: float
    p90_ms: float
    gpu_ms: float | None = None  # GPU time of one run (raggedvit.timing.gpu_time_ms), when asked for on CUDA

    def as_dict(self) -> dict:
        return asdict(self)


def bench_inputs(recipe: dict, *, random: bool = False):
    """[n, 3, S, S] float32 torch tensor: the sample photos as the recipe's timm model preprocesses them (its data
    config, at the exported img_size), or 4 seeded noise images with random=True.

    raggedvit.images.NoSampleImages when no photos are available; ValueError if timm has no such model."""
    from raggedvit.images import meta_model, sample_inputs

    name, img_size = str(recipe["model"]), int(recipe["img_size"])
    try:
        model = meta_model(name, img_size)
    except RuntimeError as e:  # timm: "Unknown model (...)"
        raise ValueError(f"the export's recipe names {name!r}, which timm cannot build: {e}") from None
    return sample_inputs(model, random_n=4 if random else None)


def bench_onnx(
    path: str | Path,
    *,
    device: str = "cpu",
    batches: tuple[int, ...] = (1, 4, 32),
    seconds: float = 0.5,
    warmup: int = 3,
    cuda_graph: bool = False,
    random: bool = False,
    images=None,
    gpu_time: bool = False,
) -> list[BenchResult]:
    """Median latency and img/s of `path` in ORT on `device` ("cpu" | "cuda") for every batch size.

    cuda_graph: replay the model as a CUDA graph (raggedvit.runtime.GraphRunner, one per batch size; static-shape
    exports only), timing the replay on the bound input buffer. random: seeded noise instead of the sample photos
    (raggedvit.images.NoSampleImages without photos and without random). images: the inputs instead, [n, 3, S, S]
    float32 torch tensor, preprocessed for the export (tiled to each batch). gpu_time (device "cuda"): also the GPU
    time of one run (BenchResult.gpu_ms). seconds, warmup: target_s and min_warmup of raggedvit.timing.measure."""
    from raggedvit.exporter.metadata import read_recipe
    from raggedvit.images import tile
    from raggedvit.runtime import create_session, tf32_for
    from raggedvit.timing import device_sync, gpu_time_ms, measure

    if cuda_graph and device != "cuda":
        raise ValueError("cuda_graph needs device='cuda'")
    if gpu_time and device != "cuda":
        raise ValueError("gpu_time needs device='cuda'")
    recipe = read_recipe(path)
    photos = bench_inputs(recipe, random=random) if images is None else images
    sync = device_sync(device)
    tf32 = device == "cuda" and tf32_for(recipe)
    sess = None if cuda_graph or device == "cuda" else create_session(path, device)
    results = []
    for batch in batches:
        x = tile(photos, batch).numpy()
        if device == "cuda" and not cuda_graph:  # the batch fixed: its shape arithmetic folds into constants
            sess = create_session(path, device, tf32=tf32, batch=batch)
        if cuda_graph:
            import torch

            from raggedvit.runtime import GraphRunner

            runner = GraphRunner(path, batch)
            runner.images.copy_(torch.from_numpy(x))
            torch.cuda.synchronize()

            def run(runner=runner):
                runner.replay()  # synchronous: ORT waits for the replay before returning
                return None, runner.token_counts
        elif device == "cuda":
            import torch

            from raggedvit.runtime import run_with_iobinding

            xt = torch.from_numpy(x).cuda()

            def run(xt=xt, sess=sess):
                return run_with_iobinding(sess, {"images": xt})
        else:

            def run(x=x, sess=sess):
                return sess.run(None, {"images": x})

        box: dict = {}

        def step(run=run, box=box) -> None:
            box["out"] = run()  # the last run's token counts are reported

        t = measure(step, sync, target_s=seconds, min_warmup=warmup)
        gpu_ms = gpu_time_ms(step) if gpu_time else None
        out = box["out"]
        counts = out[1]
        if hasattr(counts, "cpu"):  # a torch tensor (the CUDA-graph runner's buffer)
            counts = counts.cpu()
        counts = counts if isinstance(counts, np.ndarray) else counts.numpy()
        mean_tokens = [float(c) for c in np.asarray(counts, np.float64).mean(axis=0)] if counts.size else []
        results.append(
            BenchResult(
                batch, t.median_ms, batch / (t.median_ms / 1e3), t.runs, mean_tokens, t.p10_ms, t.p90_ms, gpu_ms
            )
        )
    return results


def plot_results(results: list[BenchResult], path: str | Path, *, title: str = "") -> Path:
    """A PNG at `path` of img/s (median) per batch size, with the p10-p90 range as error bars and each value
    written beside its point; batch sizes on a log2 axis. Needs matplotlib (the `images` extra): ModuleNotFoundError
    without it. Written atomically; returns the path."""
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg  # no pyplot: no global figure state or backend
    from matplotlib.figure import Figure

    from raggedvit.outputs import atomic_write

    if not results:
        raise ValueError("no results to plot")
    rows = sorted(results, key=lambda r: r.batch)
    batches = [r.batch for r in rows]
    ips = [r.img_per_s for r in rows]
    # img/s of the p90 latency is the low end of the range, of the p10 latency the high end
    low = [v - r.batch / (r.p90_ms / 1e3) for v, r in zip(ips, rows)]
    high = [r.batch / (r.p10_ms / 1e3) - v for v, r in zip(ips, rows)]
    fig = Figure(figsize=(6, 4), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.errorbar(batches, ips, yerr=[low, high], marker="o", capsize=3)
    for b, v in zip(batches, ips):
        ax.annotate(f"{v:,.0f}", (b, v), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
    if len(set(batches)) > 1:
        ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("batch size")
    ax.set_ylabel("images / s (median)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return atomic_write(path, buf.getvalue())
