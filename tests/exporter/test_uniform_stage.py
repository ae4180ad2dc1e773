"""The uniform (static-shape) pruning stage keeps exactly the rows of the general (NonZero) stage, ties included."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from onnx import TensorProto

from raggedvit.exporter._builder import GraphBuilder
from raggedvit.exporter.embed import Packed, cu_from_counts
from raggedvit.exporter.prune import prune_stage, uniform_keep


def _stage_model(n: int, p: int, c: int, keep: float, *, uniform: bool):
    """Graph: x [B*n, C], scores [B*n], counts [B] -> x' [T', C], counts' [B], cu' [B+1]."""
    g = GraphBuilder()
    x = g.add_input("x", TensorProto.FLOAT, ["T", c])
    scores = g.add_input("scores", TensorProto.FLOAT, ["T"])
    counts = g.add_input("counts", TensorProto.INT64, ["B"])
    cu = cu_from_counts(g, counts, "cu")
    cu32 = g.op("Cast", [cu], to=TensorProto.INT32)
    state = Packed(x=x, cu=cu, cu32=cu32, counts=counts, nmax=n, uniform=n if uniform else None)
    out = prune_stage(g, state, scores, policy="topk-l2", keep=keep, mass=0.9, fuse=False, num_prefix=p, hint="s")
    assert (out.uniform is not None) == uniform
    for name, t in (("x_out", out.x), ("counts_out", out.counts), ("cu_out", out.cu)):
        g.op("Identity", [t], outputs=[name])
    g.add_output("x_out", TensorProto.FLOAT, ["T2", c])
    g.add_output("counts_out", TensorProto.INT64, ["B"])
    g.add_output("cu_out", TensorProto.INT64, ["B1"])
    return g.build("stage", {"": 17}), out


@pytest.mark.parametrize("p,keep", [(1, 0.5), (0, 0.7), (2, 0.01), (1, 1.0)])
def test_uniform_stage_equals_general_stage(ort_session, p, keep):
    B, n, C = 3, 11, 4
    rng = np.random.default_rng(0)
    x = rng.standard_normal((B * n, C)).astype(np.float32)
    scores = rng.integers(0, 3, size=B * n).astype(np.float32)  # many exact ties at the cut
    feeds = {"x": x, "scores": scores, "counts": np.full(B, n, np.int64)}
    uni_model, uni_state = _stage_model(n, p, C, keep, uniform=True)
    gen_model, _ = _stage_model(n, p, C, keep, uniform=False)
    ops = {node.op_type for node in uni_model.graph.node}
    assert "NonZero" not in ops and "TopK" in ops
    got = ort_session(uni_model).run(None, feeds)
    want = ort_session(gen_model).run(None, feeds)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    m = p + uniform_keep(n, p, keep)
    assert uni_state.uniform == m and list(got[1]) == [m] * B and list(got[2]) == [m * b for b in range(B + 1)]


def test_uniform_keep_matches_float32_rule():
    assert uniform_keep(197, 1, 0.5) == 98
    assert uniform_keep(197, 1, 0.7) == int(np.ceil(np.float32(0.7) * np.float32(196)))
    assert uniform_keep(5, 1, 0.0) == 1 and uniform_keep(5, 1, 1.0) == 4


def test_packed_replace_keeps_uniform():
    s = Packed(x="x", cu="cu", cu32="cu32", counts="n", nmax=5, uniform=5)
    assert dataclasses.replace(s, x="y").uniform == 5
