"""Latency of a zero-argument callable: warm-up, then the median of N synchronized runs; and its GPU time.

The one timing loop of `raggedvit bench` (raggedvit.timing.bench), `raggedvit sweep` and the benchmarks package.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Timing", "cpu_name", "device_sync", "gpu_time_ms", "measure", "start_cupti"]


@dataclass(frozen=True)
class Timing:
    """Host wall time per run in milliseconds: median and 10th / 90th percentiles of `runs` timed runs."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    runs: int
    warmup_runs: int


def cpu_name() -> str:
    """The host CPU as a result records it: its model name (Linux /proc/cpuinfo, else the platform's processor) and
    core count, e.g. "AMD EPYC 7B13 (2 cores)"."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        pass
    return f"{name} ({os.cpu_count()} cores)"


def device_sync(device: str) -> Callable[[], None]:
    """A function that waits for all queued work of `device` ("cuda": torch.cuda.synchronize, "cpu": no-op)."""
    if device == "cuda":
        import torch

        return torch.cuda.synchronize
    return lambda: None


def measure(
    fn: Callable[[], object],
    sync: Callable[[], None],
    *,
    target_s: float = 0.4,
    warmup_s: float = 0.2,
    min_warmup: int = 3,
    min_runs: int = 5,
    max_runs: int = 1000,
    runs: int | None = None,
) -> Timing:
    """Warm up (>= min_warmup runs and >= warmup_s seconds), then time N runs, each between two `sync()` calls.

    N = `runs` when given; else target_s / (latency of the last warm-up run), clamped to [min_runs, max_runs], and a
    run slower than target_s / 3 gets at most 3 timed runs so one slow case cannot eat the budget. Host wall time
    per run (perf_counter), so launch overhead counts as it does for a user.
    """
    start = time.perf_counter()
    warm, last = 0, 0.0
    while warm < min_warmup or time.perf_counter() - start < warmup_s:
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        last = time.perf_counter() - t0
        warm += 1
    if runs is None:
        runs = max(min_runs, min(max_runs, math.ceil(target_s / max(last, 1e-6))))
        if last > target_s / 3:
            runs = min(runs, 3)
    elif runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    times = []
    for _ in range(runs):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return Timing(
        median_ms=statistics.median(times),
        p10_ms=times[int(0.1 * (len(times) - 1))],
        p90_ms=times[int(0.9 * (len(times) - 1))],
        runs=runs,
        warmup_runs=warm,
    )


def gpu_time_ms(fn: Callable[[], object], *, runs: int = 10) -> float | None:
    """GPU time of one call of `fn` in milliseconds: the summed durations of the CUDA kernels, copies and memsets it
    queues on any stream (ONNX Runtime's own and CUDA-graph replays included; torch.profiler with CUPTI), averaged
    over `runs` traced calls after one untraced call. Work that overlaps on several streams counts twice. None when
    CUPTI saw no GPU work (CUDA graphs captured before CUPTI was first started can be invisible to it: call
    `start_cupti()` before capturing any)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            fn()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(e.device_time for e in events) / runs / 1e3 if events else None


def start_cupti() -> None:
    """An empty torch.profiler session on the GPU: CUPTI is initialised before any CUDA graph is captured, so that
    gpu_time_ms sees their replays."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]):
        torch.cuda.synchronize()
