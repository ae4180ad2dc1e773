"""benchmarks.graph_overhead's split of CUPTI kernel records into calls (the GPU parts need CUDA)."""

from __future__ import annotations

from benchmarks.graph_overhead import call_spans, node_kinds


def test_call_spans_groups_calls_by_gaps() -> None:
    one = [(0.0, 3.0), (3.5, 6.0), (4.0, 5.0), (6.2, 10.0)]  # 10 us span; busy sums durations (overlaps twice)
    kernels = one + [(s + 2000.0, e + 2000.0) for s, e in one] + [(s + 4000.0, e + 4000.0) for s, e in one[:3]]
    out = call_spans(list(reversed(kernels)))  # any order
    assert out["calls_seen"] == 3
    assert out["kernels_per_call"] == 4 and out["span_us"] == 10.0 and out["busy_us"] == 10.3
    assert call_spans([]) == {"calls_seen": 0}
    assert call_spans(one, gap_us=0.3)["calls_seen"] == 2  # the 0.5 us gap after the first record splits


def test_node_kinds_counts_labels_of_a_debug_dump() -> None:
    dot = """digraph dot {
subgraph cluster_0 { label="graph_0" graph[style="dashed"];
"graph_0_node_0"[style="solid" shape="rectangle" label="{KERNEL
| {ID | 0 | triton_}
}"];
"graph_0_node_1"[style="solid" shape="rectangle" label="{MEMCPY
| {ID | 1 | DtoD}
}"];
"graph_0_node_2"[style="solid" shape="rectangle" label="{KERNEL
| {ID | 2 | gemm}
}"];
"graph_0_node_3"[style="solid" shape="rectangle" label="MEMSET"];
"graph_0_node_0" -> "graph_0_node_1";
}
}"""
    assert node_kinds(dot) == {"KERNEL": 2, "MEMCPY": 1, "MEMSET": 1}
    assert node_kinds("digraph dot {}") == {}
