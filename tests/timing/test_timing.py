"""raggedvit.timing.measure: the one timing loop of `raggedvit bench` and the benchmarks package."""

from __future__ import annotations

import time

import pytest

from raggedvit.timing import measure


def test_measure_counts_runs() -> None:
    calls = []
    t = measure(lambda: calls.append(1), lambda: None, target_s=0.01, warmup_s=0.0, min_warmup=3, min_runs=5)
    assert t.warmup_runs >= 3 and t.runs >= 5 and len(calls) == t.warmup_runs + t.runs
    assert 0 <= t.p10_ms <= t.median_ms <= t.p90_ms


def test_measure_syncs_around_every_run() -> None:
    events = []
    measure(lambda: events.append("run"), lambda: events.append("sync"), warmup_s=0.0, min_warmup=2, runs=3)
    assert events == ["sync", "run", "sync"] * 5


def test_slow_runs_are_capped_unless_runs_is_given() -> None:
    def slow() -> None:
        time.sleep(0.01)

    assert measure(slow, lambda: None, target_s=0.02, warmup_s=0.0, min_warmup=1, min_runs=10).runs == 3
    assert measure(slow, lambda: None, target_s=0.02, warmup_s=0.0, min_warmup=1, runs=6).runs == 6
    with pytest.raises(ValueError, match="runs must be >= 1"):
        measure(slow, lambda: None, warmup_s=0.0, min_warmup=1, runs=0)
