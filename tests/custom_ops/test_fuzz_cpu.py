"""The seeded CPU-EP fuzz of the op library's CPU kernels (10,000 calls: RaggedAttention, every fifth a RaggedLinear
one, and RaggedSelect, BiasGelu, GatherLayerNorm, PatchEmbed, RaggedMerge and input-count cases; each batch in a
child process): no crash, every invalid input refused with an ORT error, every valid one equal to the
float64 torch reference.

The seed is fixed so that CI is reproducible; RAGGEDVIT_FUZZ_SEED=<n> explores another run. The summary line
(calls, outcomes) is printed at the end of the pytest run (tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from fuzz.attrs import ATTRS, crafted_cases
from fuzz.cases import BAD_CU, CRAFTED_NUM_HEADS, FLOATS, draw_case, expected_error
from fuzz.driver import run_fuzz
from fuzz.embed import EMBED_AT, EmbedCase, check_embed_output, draw_embed_case, embed_feeds
from fuzz.linear import LinearCase, draw_any, draw_linear_case, expected_any
from fuzz.merge import FAULTS as MERGE_FAULTS
from fuzz.merge import MERGE_AT, MERGE_EVERY, MergeFuzzCase, merge_expected_error
from fuzz.norm import NORM_AT, NormCase, draw_norm_case, live_rows
from fuzz.select import SelectFuzzCase, draw_select_case

CALLS = 10_000
SEED = int(os.environ.get("RAGGEDVIT_FUZZ_SEED", "14"))


@pytest.mark.slow
def test_cpu_fuzz(ort_library, record_property):
    summary = run_fuzz(SEED, CALLS, batch=2_500, jobs=2, budget_s=150.0)
    record_property("ci_summary", summary.line())
    print(summary.report())
    assert not summary.crashes, summary.report()
    assert not summary.failures, summary.report()
    assert summary.calls >= CALLS and not summary.timed_out, summary.report()
    assert summary.outcomes["checked"] > CALLS // 4, summary.report()  # the valid path is exercised too


def test_merge_cases_cover_every_fault_and_the_fused_residual():
    """index % MERGE_EVERY == MERGE_AT is a RaggedMerge case (and no other index): every fault, and valid calls of
    each float type, with and without skip / skip_bias, empty images and every head dim."""
    cases = [draw_any(SEED, i) for i in range(CALLS)]
    merge = [c for c in cases if isinstance(c, MergeFuzzCase)]
    assert all(c.index % MERGE_EVERY == MERGE_AT for c in merge) and len(merge) == CALLS // MERGE_EVERY
    faults = Counter(c.fault for c in merge)
    assert set(faults) == {"", *MERGE_FAULTS} and faults[""] > 250, faults
    valid = [c for c in merge if merge_expected_error(c) is None]
    assert {c.x_elem for c in valid} == {"float", "float16", "bfloat16"} and {c.Dh for c in valid} == {1, 4, 16, 64}
    assert sum(c.skip_bias for c in valid) > 50 and sum(c.skip and not c.skip_bias for c in valid) > 30
    assert sum(not c.skip for c in valid) > 100 and any(c.n == 0 for c in valid) and any(c.r > c.n for c in valid)


def test_cases_cover_the_crafted_inputs():
    """The first CALLS cases hold every crafted num_heads, float dtype, cu_seqlens breakage and refusal kind."""
    cases = [draw_case(SEED, i) for i in range(CALLS)]
    assert set(CRAFTED_NUM_HEADS) <= {c.num_heads for c in cases}
    assert set(FLOATS) | {"double", "int32"} <= {c.qkv_elem for c in cases}
    assert {"int32", "int64", "float"} <= {c.cu_elem for c in cases}
    reasons = Counter((expected_error(c) or "valid").split(":")[0] for c in cases)
    kinds = ("valid", "num_heads", "scale", "max_seqlen", "qkv type", "qkv rank", "qkv width", "bias")
    assert all(reasons[k] > 50 for k in (*kinds, "cu_seqlens values", "cu_seqlens shape", "cu_seqlens type")), reasons
    assert len(BAD_CU) == 10 and any(c.bias_elem for c in cases) and any(c.declared for c in cases)
    # relative position bias: refusals of each kind, and valid calls with out-of-range token_pos values
    assert all(reasons[k] > 50 for k in ("pos attributes", "pos_table", "token_pos")), reasons
    valid_pos = [c for c in cases if c.pos_table_elem and expected_error(c) is None]
    assert len(valid_pos) > 300 and sum(c.token_pos_odd > 0 for c in valid_pos) > 100
    assert {0, 1, 2} <= {c.num_prefix for c in valid_pos} and {"int32", "int64"} <= {
        c.token_pos_elem for c in valid_pos
    }
    assert draw_case(SEED, 123) == draw_case(SEED, 123)  # a reported call replays alone


def test_a_crash_is_reported_with_seed_and_call(ort_library, monkeypatch):
    """A child dying inside a call is reported (seed, call, case, replay) and the batch goes on after it."""
    monkeypatch.setenv("RAGGEDVIT_FUZZ_KILL_AT", "5")
    summary = run_fuzz(SEED, 12, batch=12, jobs=1, budget_s=60.0)
    assert len(summary.crashes) == 1, summary.report()
    crash = summary.crashes[0]
    assert f"call 5 (seed {SEED}) died of SIGSEGV" in crash and f"--seed {SEED} --first 5 --calls 1" in crash
    assert summary.calls == 11 and not summary.ok


def test_linear_cases_cover_valid_and_refused_inputs():
    """Every fifth call is a RaggedLinear case: valid ones with dead rows and clamped CuSeqlens, and each refusal."""
    cases = [draw_any(SEED, i) for i in range(CALLS)]
    linear = [c for c in cases if isinstance(c, LinearCase)]
    assert len(linear) == CALLS // 5
    reasons = Counter((expected_any(c) or "valid").split(":")[0] for c in linear)
    kinds = ("X type", "X rank", "W shape", "W type", "Bias", "Residual", "CuSeqlens shape", "CuSeqlens type",
             "activation")  # fmt: skip
    assert reasons["valid"] > 1000 and all(reasons[f"linear {k}"] >= 5 for k in kinds), reasons
    valid = [c for c in linear if expected_any(c) is None]
    dead = [c for c in valid if c.cu_elem and 0 < c.x_shape[0] and int(c.cu[-1]) < c.x_shape[0]]
    assert len(dead) > 100 and any(int(c.cu[-1]) > c.x_shape[0] for c in valid if c.cu_elem)
    assert {0, 1} <= {c.activation for c in valid} and any(c.x_shape[0] == 0 for c in valid)
    assert draw_linear_case(SEED, 9) == draw_any(SEED, 9)  # a reported call replays alone


def test_select_cases_cover_valid_and_refused_inputs():
    """Every tenth call (index % 10 == 2) is a RaggedSelect case: valid ones and each refusal kind."""
    cases = [draw_any(SEED, i) for i in range(CALLS)]
    select = [c for c in cases if isinstance(c, SelectFuzzCase)]
    assert len(select) == CALLS // 10
    reasons = Counter(expected_any(c) or "valid" for c in select)
    assert reasons["valid"] > 300 and reasons["select attributes"] > 50 and reasons["select cu"] > 50, reasons
    assert reasons["select fraction"] > 50, reasons  # keep / mass outside (0, 1]: 1e20, 1.5, 0, -0.1, nan, inf
    assert reasons["select huge width"] > 20, reasons  # width past max(T, 2**16): refused before any allocation
    bad = [c.keep if not 0 < c.keep <= 1 else c.mass for c in select if expected_any(c) == "select fraction"]
    assert {1e20, 1.5} <= set(bad) and any(v != v for v in bad), sorted(set(map(str, bad)))
    assert draw_select_case(SEED, 12) == draw_any(SEED, 12)  # a reported call replays alone


def test_embed_cases_cover_valid_and_refused_inputs():
    """Every tenth call (index % 10 == EMBED_AT) is a PatchEmbed case: valid ones of every patch size 1..16, both
    image types, crops (H, W not multiples of patch), P = 0, B = 0, no patch rows (L = 0), and each refusal; the
    other calls are the other ops' (they keep their indices)."""
    cases = [draw_any(SEED, i) for i in range(CALLS)]
    embed = [c for c in cases if isinstance(c, EmbedCase)]
    assert len(embed) == CALLS // 10 and all(c.index % 10 == EMBED_AT for c in embed)
    reasons = Counter((expected_any(c) or "valid").split(":")[0] for c in embed)
    kinds = ("patch", "Images rank", "Images type", "Weight", "Prefix", "Pos")
    assert reasons["valid"] > 500 and all(reasons[f"embed {k}"] >= 15 for k in kinds), reasons
    valid = [c for c in embed if expected_any(c) is None]
    assert set(range(1, 17)) <= {c.patch for c in valid} and {c.image_elem for c in valid} == {"float", "float16"}
    dims = [(*c.image_shape, c.patch, c.inputs[1][2][0]) for c in valid]  # B, C, H, W, patch, P
    assert sum(H % p > 0 or W % p > 0 for _, _, H, W, p, _ in dims) > 300
    assert sum(P == 0 for *_, P in dims) > 100 and sum(B == 0 for B, *_ in dims) > 10
    assert sum((H // p) * (W // p) == 0 for _, _, H, W, p, _ in dims) > 30 and sum(C == 0 for _, C, *_ in dims) > 5
    assert draw_embed_case(SEED, 13) == draw_any(SEED, 13)  # a reported call replays alone
    assert not any(isinstance(draw_any(SEED, i), EmbedCase) for i in range(100) if i % 10 != EMBED_AT)


def test_embed_check_catches_a_wrong_output():
    """check_embed_output (no op run) accepts the reference itself and refuses patch rows shifted by one, an element
    1% off, and a nan."""
    from raggedvit.kernels.patch_embed import patch_embed_reference

    def plain(c: EmbedCase) -> bool:  # valid, no specials, two images of >= 4 patches, N >= 8
        B, _, H, W = c.image_shape
        return (
            not c.specials
            and B >= 2
            and c.patch >= 4
            and (H // c.patch) * (W // c.patch) >= 4
            and c.inputs[0][2][1] >= 8
        )

    drawn = (draw_embed_case(SEED, i) for i in range(EMBED_AT, 10**5, 10))
    c = next(c for c in drawn if expected_any(c) is None and plain(c))
    feeds = embed_feeds(c)
    args = [feeds[n] for n in ("Images", "Weight", "Prefix", "Pos")]
    out = patch_embed_reference(*args, c.patch, compute_dtype=torch.float64).to(torch.float16).numpy()
    assert check_embed_output(out, feeds, c.patch) is None, c.describe()
    P = c.inputs[1][2][0]
    shifted = out.copy()
    shifted[1, P:] = np.roll(out[1, P:], 1, axis=0)
    off = out.copy()
    j = int(np.argmax(np.abs(out[0, P:, 0]))) + P
    off[0, j, 0] = out[0, j, 0] * np.float16(1.01)
    nan = out.copy()
    nan[-1, -1, -1] = np.nan
    for bad in (shifted, off, nan):
        assert check_embed_output(bad, feeds, c.patch) is not None


def test_norm_cases_cover_valid_and_refused_inputs():
    """Every tenth call (index % 10 == NORM_AT) is a GatherLayerNorm case: valid ones with and without CuSeqlens
    (dead rows, CuSeqlens[B] above R and negative: clamped; both cu types), and each refusal kind."""
    cases = [draw_any(SEED, i) for i in range(CALLS)]
    norm = [c for c in cases if isinstance(c, NormCase)]
    assert len(norm) == CALLS // 10 and all(c.index % 10 == NORM_AT for c in norm)
    reasons = Counter((expected_any(c) or "valid").split(":")[0] for c in norm)
    kinds = ("X rank", "X type", "Index", "Gamma", "Beta", "Skip", "Bias", "epsilon", "CuSeqlens shape",
             "CuSeqlens type")  # fmt: skip
    assert reasons["valid"] > 500 and all(reasons[f"norm {k}"] >= 5 for k in kinds), reasons
    valid = [c for c in norm if expected_any(c) is None]
    live = [c for c in valid if c.cu_elem]
    assert len(live) > 150 and {c.cu_elem for c in live} == {"int32", "int64"}
    assert sum(0 < live_rows(c) < c.index_shape[0] for c in live) > 30
    assert any(live_rows(c) == 0 < c.index_shape[0] for c in live)
    assert any(int(c.cu[-1]) > c.index_shape[0] for c in live) and any(int(c.cu[-1]) < 0 for c in live)
    assert any(len(c.cu) == 1 for c in live)  # B = 0
    assert draw_norm_case(SEED, 15) == draw_any(SEED, 15)  # a reported call replays alone


def test_norm_check_refuses_written_dead_rows():
    """_fuzz_norm._check accepts the reference and refuses a dead row that is not zero, or a live row 1% off."""
    from fuzz.norm import _check, _tensors

    from raggedvit.kernels.gather_layer_norm import gather_layer_norm_reference

    drawn = (draw_norm_case(SEED, i) for i in range(NORM_AT, 10**5, 10))
    c = next(c for c in drawn if expected_any(c) is None and c.cu_elem and not c.specials and c.epsilon >= 1e-6
             and 2 <= live_rows(c) < c.index_shape[0] and c.x_shape[1] >= 4)  # fmt: skip
    feeds = _tensors(c)
    n, s = gather_layer_norm_reference(feeds["X"], feeds["Index"], feeds["Gamma"], feeds["Beta"], feeds.get("Skip"),
                                       feeds.get("Bias"), c.epsilon, feeds["CuSeqlens"])  # fmt: skip
    live = live_rows(c)
    assert _check(n, s, feeds, c.epsilon, live) is None, c.describe()
    dead = n.clone()
    dead[live, 0] = 1.0
    assert "dead rows" in _check(dead, s, feeds, c.epsilon, live)
    off = n.clone()
    off[0] = torch.where(off[0] != 0, off[0] * 1.01, torch.ones_like(off[0]))
    assert "differs" in _check(off, s, feeds, c.epsilon, live)


def test_crafted_attributes_and_sizes_of_every_op(ort_library):
    """fuzz.attrs in a child process: every attribute of every op as an int and as a float, at int64 / float32
    limits (all seven ops), and zero-size tensors whose other dims multiply past 2**63 (all but RaggedMerge, whose
    empty inputs allocate empty outputs): no crash, each valid node
    loads, each invalid one is refused naming the attribute or input."""
    here = Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here), str(here.parents[1])]), "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-m", "fuzz.attrs"], capture_output=True, text=True, env=env,
                         timeout=300, check=False)  # fmt: skip
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    cases = crafted_cases()
    assert res.returncode == 0 and len(rows) == len(cases), res.stderr[-2000:]  # a crash ends the lines early
    assert not [r for r in rows if r["outcome"] == "failed"], [r for r in rows if r["outcome"] == "failed"]
    ops = Counter(r["case"].split()[0] for r in rows)
    assert set(ops) == {*ATTRS, "BiasGelu"}, ops  # all seven ops
    refused = Counter(r["outcome"] for r in rows)
    assert refused["refused"] > 200 and refused["loaded"] > 50 and refused["ran"] == 0, refused
    for op, attrs in ATTRS.items():  # each attribute given as the other numeric type is refused naming it
        for name, (kind, _) in attrs.items():
            other = "float" if kind is int else "int"
            hits = [r for r in rows if r["case"].startswith(f"{op} {name}=") and r["case"].endswith(f"({other})")]
            assert hits and all(r["outcome"] == "refused" and f"'{name}'" in r["error"] for r in hits), (op, name)
