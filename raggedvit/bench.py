"""Throughput of an exported model in ONNX Runtime (the library behind `raggedvit bench`).

Inputs are the bundled sample photos (or seeded noise), preprocessed as the recipe's model says, tiled to
each batch size and bound where the session runs (GPU io binding on CUDA). Timing is host wall time of
synchronous runs after a warm-up; the median is reported.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

__all__ = ["BenchResult", "bench_onnx"]


@dataclass(frozen=True)
class BenchResult:
    """One batch size: median latency of a session run and the images per second it gives."""

    batch: int
    latency_ms: float
    img_per_s: float
    runs: int
    mean_tokens: list[float]  # mean kept tokens per image after each pruning stage

    def as_dict(self) -> dict:
        return asdict(self)


def _inputs(img_size: int, batch: int) -> np.ndarray:
    """[batch, 3, S, S] float32: sample photos normalised with ImageNet statistics, tiled (noise if none)."""
    try:
        from PIL import Image

        from raggedvit.images import sample_images

        mean = np.array([0.485, 0.456, 0.406], np.float32)[:, None, None]
        std = np.array([0.229, 0.224, 0.225], np.float32)[:, None, None]
        imgs = [
            (np.asarray(im.convert("RGB").resize((img_size, img_size), Image.BICUBIC), np.float32) / 255.0).transpose(
                2, 0, 1
            )
            for _, im in sample_images()
        ]
        arr = (np.stack(imgs) - mean) / std
    except Exception:  # noqa: BLE001 - no image packages: seeded noise keeps the benchmark usable
        arr = np.random.default_rng(0).standard_normal((4, 3, img_size, img_size)).astype(np.float32)
    reps = -(-batch // len(arr))
    return np.ascontiguousarray(np.concatenate([arr] * reps)[:batch].astype(np.float32))


def bench_onnx(
    path: str | Path,
    *,
    device: str = "cpu",
    batches: tuple[int, ...] = (1, 4, 32),
    seconds: float = 0.5,
    warmup: int = 3,
    cuda_graph: bool = False,
) -> list[BenchResult]:
    """Median latency and img/s of `path` in ORT on `device` ("cpu" | "cuda") for every batch size.

    cuda_graph: replay the model as a CUDA graph (raggedvit.runtime.GraphRunner, one per batch size; static-shape
    exports only), timing the replay on the bound input buffer."""
    from raggedvit.exporter.metadata import read_recipe
    from raggedvit.runtime import create_session, tf32_for

    if cuda_graph and device != "cuda":
        raise ValueError("cuda_graph needs device='cuda'")
    recipe = read_recipe(path)
    img_size = int(recipe["img_size"])
    tf32 = device == "cuda" and tf32_for(recipe)
    sess = None if cuda_graph or device == "cuda" else create_session(path, device)
    results = []
    for batch in batches:
        x = _inputs(img_size, batch)
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

        for _ in range(warmup):
            out = run()
        times: list[float] = []
        t_end = time.perf_counter() + seconds
        while time.perf_counter() < t_end or len(times) < 5:
            t0 = time.perf_counter()
            out = run()
            times.append(time.perf_counter() - t0)
        counts = out[1]
        if hasattr(counts, "cpu"):  # a torch tensor (the CUDA-graph runner's buffer)
            counts = counts.cpu()
        counts = counts if isinstance(counts, np.ndarray) else counts.numpy()
        mean_tokens = [float(c) for c in np.asarray(counts, np.float64).mean(axis=0)] if counts.size else []
        med = statistics.median(times)
        results.append(BenchResult(batch, med * 1e3, batch / med, len(times), mean_tokens))
    return results
