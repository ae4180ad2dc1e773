"""raggedvit exports of every model and policy, made in worker processes while the GPU work of the run starts.

Each job loads the seeded timm weights itself (raggedvit.weights.load_vit, seed 0: the weights the torch variants
use) and calls raggedvit.exporter.export_onnx; a failed job returns its error text instead of a path.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import traceback
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

__all__ = ["ExportJob", "Exports", "export_job"]


@dataclass(frozen=True)
class ExportJob:
    """One export: `policy` is a policy string ("none" or e.g. "topk-l2:keep=0.5:at=4")."""

    timm_name: str
    policy: str
    dtype: str
    path: str
    model_kwargs: tuple[tuple[str, Any], ...] = ()


def export_job(job: ExportJob) -> dict[str, Any]:
    """Run one export; returns {"path", "seconds", "nodes", "static_shapes"} or {"error", "seconds"}."""
    t0 = time.perf_counter()
    try:
        import onnx

        from benchmarks.e2e.cases import parse_policy
        from benchmarks.serving.names import split_linear
        from raggedvit.exporter import export_onnx
        from raggedvit.pruning import PruneSpec
        from raggedvit.weights import load_vit

        policy, linear = split_linear(job.policy)
        spec = PruneSpec("none") if policy == "none" else parse_policy(policy)
        vit, info = load_vit(job.timm_name, seed=0, model_kwargs=dict(job.model_kwargs) or None)
        recipe = {"model": job.timm_name, "weights": info.to_dict(), "benchmark": "benchmarks.serving"}
        # adaptive policies export in the capacity layout (static row counts per stage): one CUDA graph per batch
        capacity = not spec.static_shapes
        extra = {"ragged_linear": linear} if linear else {}
        export_onnx(vit, spec, job.path, dtype=job.dtype, recipe=recipe, capacity=capacity, **extra)
        nodes = len(onnx.load(job.path, load_external_data=False).graph.node)
        return {
            "path": job.path,
            "seconds": round(time.perf_counter() - t0, 1),
            "nodes": nodes,
            "static_shapes": True,  # static per batch size: static_shapes policies, or the capacity layout
            "capacity": capacity,
            "ragged_linear": linear,
        }
    except Exception as exc:  # noqa: BLE001 - the run records it and goes on
        traceback.print_exc()
        error = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:600]
        return {"error": error, "seconds": round(time.perf_counter() - t0, 1)}


def _init_worker(threads: int) -> None:
    """Each export process gets its share of the cores (torch would start one thread per core in every one)."""
    import torch

    torch.set_num_threads(threads)


class Exports:
    """Submits ExportJobs to `workers` spawned processes (0: each export runs in this process when asked for);
    `result(job)` waits for one."""

    def __init__(self, jobs: list[ExportJob], workers: int) -> None:
        self.jobs = jobs
        self._pool: ProcessPoolExecutor | None = None
        self._futures: dict[ExportJob, Future] = {}
        self._done: dict[ExportJob, dict[str, Any]] = {}
        if workers > 0 and jobs:
            # spawn: the parent holds a CUDA context, which forked children must not inherit
            threads = max(1, (os.cpu_count() or 1) // workers)
            self._pool = ProcessPoolExecutor(
                max_workers=workers, mp_context=mp.get_context("spawn"), initializer=_init_worker, initargs=(threads,)
            )
            self._futures = {job: self._pool.submit(export_job, job) for job in jobs}

    def result(self, job: ExportJob) -> dict[str, Any]:
        if job not in self._done:
            if job in self._futures:
                try:
                    self._done[job] = self._futures[job].result()
                except Exception as exc:  # noqa: BLE001 - a dead worker process
                    self._done[job] = {"error": f"export worker failed: {type(exc).__name__}: {exc}"[:600]}
            else:
                self._done[job] = export_job(job)
        return self._done[job]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
