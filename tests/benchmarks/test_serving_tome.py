"""The serving benchmark's tome preset: tome r=8 / 16 and topk-l2 keeping the same final token count."""

from __future__ import annotations

import pytest
import torch

from benchmarks.e2e.cases import parse_policy
from benchmarks.serving.driver import build_config, main
from benchmarks.serving.names import TOME_POLICIES, matched_topk, tome_tokens
from raggedvit.pruning import PrunedViT
from raggedvit.pruning.spec import uniform_keep
from raggedvit.weights import load_vit


def test_matched_final_counts() -> None:
    """deit (197 tokens, a class token, 12 blocks): tome r=8 ends at 101 tokens, r=16 at 11; each topk-l2 peer
    keeps exactly that many at block 4."""
    assert tome_tokens(197, 1, 8, 12) == 101 and tome_tokens(197, 1, 16, 12) == 11
    assert TOME_POLICIES == ("tome:r=8", matched_topk(197, 1, 101), "tome:r=16", matched_topk(197, 1, 11))
    for text, final in zip(TOME_POLICIES[1::2], (101, 11)):
        spec = parse_policy(text)
        assert spec.prune_at == (4,) and 1 + uniform_keep(197, 1, spec.keep) == final
    assert parse_policy("tome:r=8").prune_at == () and parse_policy("tome:r=8:at=0,3").prune_at == (0, 3)


def test_tome_tokens_is_what_prunedvit_merges() -> None:
    vit, _ = load_vit("deit_tiny_patch16_224", seed=0, model_kwargs={"depth": 3})
    with torch.no_grad():
        out = PrunedViT(vit, parse_policy("tome:r=16"))(torch.zeros(1, 3, 224, 224))
    assert out.token_counts.tolist() == [[tome_tokens(197, 1, 16, b) for b in (1, 2, 3)]]


def test_tome_flag_sets_the_policies(monkeypatch) -> None:
    seen = {}

    def stop(args):  # the configuration, then no run
        seen["policies"] = build_config(args).policies
        raise SystemExit(0)

    monkeypatch.setattr("benchmarks.serving.driver.build_config", stop)
    with pytest.raises(SystemExit):
        main(["--tome", "--device", "cpu", "--smoke"])
    assert seen["policies"] == TOME_POLICIES


def test_cpu_smoke_run_writes_its_own_file_with_the_bars(tmp_path) -> None:
    """--tome writes serving_tome_<machine>.json (not the serving run's file) and judges the bars at its end; on the
    CPU (deit_tiny, depth 2, batch 1, the tome policies only) the batch-1 bar is judged on img/s."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "-m", "benchmarks.serving", "--tome", "--device", "cpu", "--smoke", "--depth", "2",
           "--batches", "1", "--export-workers", "0", "--variants", "ort_unpruned,ort_raggedvit", "--out",
           str(tmp_path), "--policies", "tome:r=8", "tome:r=16"]  # fmt: skip (topk-l2's block 4 needs 5 blocks)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=root)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not list(tmp_path.glob("serving_cpu.*"))
    data = json.loads((tmp_path / "serving_tome_cpu.json").read_text())
    assert {r["policy"] for r in data["records"] if r["status"] == "ok"} == {"none", "tome:r=8", "tome:r=16"}
    rows = {(t["r"], t["batch"]): t for t in data["tome_targets"]}
    assert set(rows) == {(8, 1), (16, 1)}
    assert all(set(t["bars"]) == {"not_slower_at_b1"} for t in rows.values())
    assert 0.5 < rows[(8, 1)]["flops_ratio"] < 1.0  # depth 2: the run's model, not the 12-block one
