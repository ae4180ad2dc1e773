"""benchmarks.graph_overhead's split of CUPTI kernel records into calls (the GPU parts need CUDA)."""

from __future__ import annotations

from benchmarks.graph_overhead import call_spans, host_us, queued_us


def test_call_spans_groups_calls_by_gaps() -> None:
    one = [(0.0, 3.0), (3.5, 6.0), (4.0, 5.0), (6.2, 10.0)]  # 10 us span; busy sums durations (overlaps twice)
    kernels = one + [(s + 2000.0, e + 2000.0) for s, e in one] + [(s + 4000.0, e + 4000.0) for s, e in one[:3]]
    out = call_spans(list(reversed(kernels)))  # any order
    assert out["calls_seen"] == 3
    assert out["kernels_per_call"] == 4 and out["span_us"] == 10.0 and out["busy_us"] == 10.3
    assert call_spans([]) == {"calls_seen": 0}
    assert call_spans(one, gap_us=0.3)["calls_seen"] == 2  # the 0.5 us gap after the first record splits


def test_host_and_queued_timing_call_counts() -> None:
    calls = {"fn": 0, "sync": 0}

    def fn() -> None:
        calls["fn"] += 1

    def sync() -> None:
        calls["sync"] += 1

    assert host_us(fn, sync, calls=7) >= 0.0
    assert calls == {"fn": 7, "sync": 8}  # a sync before each call and one after the last
    calls.update(fn=0, sync=0)
    assert queued_us(fn, sync, depth=5, calls=3) >= 0.0
    assert calls["fn"] == 15 and calls["sync"] == 3 * 2 + 1  # one sync per burst besides host_us's own
