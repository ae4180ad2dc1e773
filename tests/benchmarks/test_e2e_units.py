"""Pieces of benchmarks.e2e on CPU: policies, timing, the varlen hook's cls attention, the split-qkv export
model, ORT profile summaries, speedups and tables."""

from __future__ import annotations

import json
import math

import pytest
import torch

from benchmarks.e2e.cases import BASELINES, PRUNED, BenchConfig, parse_policy, resolve_case
from benchmarks.e2e.onnx_baselines import SplitQKVAttention
from benchmarks.e2e.profile import section_of, summarize_ort_profile
from benchmarks.e2e.report import compact_table, speedups
from benchmarks.e2e.varlen import VarlenAttention, cls_attention
from benchmarks.readme_table import markdown
from raggedvit.kernels import ragged_attention_reference
from raggedvit.pruning import PrunedViT, PruneSpec
from raggedvit.weights import load_vit
from tests.support.testing import assert_close


def test_parse_policy_and_cases() -> None:
    assert parse_policy("topk-l2:keep=0.5:at=4") == PruneSpec("topk-l2", prune_at=(4,), keep=0.5)
    assert parse_policy("cls-mass:mass=0.9:at=3,6,9") == PruneSpec("cls-mass", prune_at=(3, 6, 9), mass=0.9)
    assert parse_policy("evit:keep=0.7:at=4,7:fuse").fuse
    with pytest.raises(ValueError, match="unknown field"):
        parse_policy("topk-l2:ratio=0.5")
    with pytest.raises(ValueError, match="none"):
        parse_policy("none")
    assert resolve_case("deit_base", 384).timm_name == "deit_base_patch16_384"
    small = resolve_case("deit_small", 384)
    assert (small.timm_name, small.img_size_arg) == ("deit_small_patch16_224", 384)
    with pytest.raises(ValueError, match="no timm model"):
        resolve_case("not_a_model", 224)
    cfg = BenchConfig(batches=(1, 2))
    assert BenchConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


@pytest.mark.parametrize("lengths", [[5, 1, 17], [9], [3, 3, 3, 3]])
def test_cls_attention_matches_reference(lengths: list[int]) -> None:
    H, D, W = 3, 16, 20
    g = torch.Generator().manual_seed(len(lengths))
    T = sum(lengths)
    qkv = torch.randn(T, 3 * H * D, generator=g)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    q, k, _ = qkv.view(T, 3, H, D).unbind(1)
    got = cls_attention(q, k, cu, W, 0.3)
    _, want = ragged_attention_reference(qkv, cu, H, scale=0.3, return_cls_attn=True)
    assert_close(got, want, rtol=1e-5, atol=1e-7, name="cls_attn")


def _reference_core(q, k, v, cu32, max_seqlen, scale):
    """A CPU stand-in for the flash varlen core: [T, H, D] q/k/v -> [T, H, D]."""
    T, H, D = q.shape
    qkv = torch.stack((q, k, v), dim=1).reshape(T, 3 * H * D)
    return ragged_attention_reference(qkv, cu32, H, scale=scale).view(T, H, D)


@torch.no_grad()
def test_varlen_hook_in_pruned_vit() -> None:
    vit, _ = load_vit("deit_tiny_patch16_224", seed=0, model_kwargs={"depth": 3})
    images = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    spec = PruneSpec("cls-mass", prune_at=(1, 2), mass=0.8)
    got = PrunedViT(vit, spec, attention=VarlenAttention(_reference_core))(images)
    want = PrunedViT(vit, spec)(images)
    assert_close(got.logits, want.logits, rtol=1e-5, atol=1e-5, name="logits")
    assert torch.equal(got.token_counts, want.token_counts)


@torch.no_grad()
def test_split_qkv_attention_is_the_same_function() -> None:
    vit, _ = load_vit("deit_tiny_patch16_224", seed=0, model_kwargs={"depth": 1})
    attn = vit.blocks[0].attn
    x = torch.randn(2, 11, attn.qkv.in_features)
    assert_close(SplitQKVAttention(attn)(x), attn(x), rtol=1e-5, atol=1e-6, name="split qkv attention")


def test_section_of_export_names() -> None:
    assert section_of("RaggedAttention") == "attention"
    assert section_of("MatMul") == "gemm" and section_of("Gemm") == "gemm"
    assert section_of("BiasGelu") == "activation"
    assert section_of("TopK") == "prune_stage" and section_of("NonZero") == "prune_stage"
    assert section_of("SkipLayerNormalization") == "norm" and section_of("GatherLayerNorm") == "norm"
    assert section_of("RaggedLinear") == "gemm" and section_of("PatchEmbed") == "gemm"
    assert section_of("Cast") == "other"


def test_summarize_ort_profile_skips_warmup(tmp_path) -> None:
    def node(name, op, ts, dur):
        args = {"op_name": op, "provider": "CUDAExecutionProvider"}
        return {"cat": "Node", "name": f"{name}_kernel_time", "ts": ts, "dur": dur, "args": args}

    events = [{"cat": "Session", "name": "model_run", "ts": 0, "dur": 100}, node("n_blocks.0.attn", "X", 10, 99)]
    for start in (200, 400):
        events.append({"cat": "Session", "name": "model_run", "ts": start, "dur": 100})
        events += [
            node("n_blocks.0.attn", "RaggedAttention", start + 1, 30),
            node("n_head.mm", "MatMul", start + 50, 10),
        ]
    path = tmp_path / "prof.json"
    path.write_text(json.dumps(events))
    s = summarize_ort_profile(path, skip_runs=1)
    assert s["runs"] == 2 and math.isclose(s["model_run_ms"], 0.1)
    assert s["ops"][0] == {
        "op_type": "RaggedAttention",
        "provider": "CUDA",
        "us_per_run": 30.0,
        "calls_per_run": 1.0,
        "share": 0.75,
    }
    assert s["sections_us_per_run"] == {"attention": 30.0, "gemm": 10.0}


def _rec(variant, policy, batch, img_s, status="ok", tokens=None):
    return {
        "model": "deit_small",
        "img_size": 224,
        "policy": policy,
        "variant": variant,
        "batch": batch,
        "img_per_s": img_s,
        "latency_ms": batch / img_s * 1e3 if img_s else None,
        "mean_tokens": tokens,
        "status": status,
        "error": None if status == "ok" else "boom",
        "note": "",
    }


def test_speedups_tables_and_markdown() -> None:
    pol = "topk-l2:keep=0.5:at=4"
    records = [
        _rec("timm_eager_fp16", "none", 32, 1000.0),
        _rec("ort_fp16", "none", 32, 1200.0),
        _rec("ort_fp16_optimized", "none", 32, 1500.0),
        _rec("torch_padded_sdpa", pol, 32, 1000.0, tokens=[99.0]),
        _rec("torch_raggedvit", pol, 32, 2000.0, tokens=[99.0]),
        _rec("ort_raggedvit", pol, 32, 3000.0, tokens=[99.0]),
        _rec("torch_varlen", pol, 32, None, status="error"),
    ]
    (r,) = speedups(records, [pol])
    assert r["best_unpruned_variant"] == "ort_fp16_optimized"
    assert r["speedup_vs_best_unpruned"] == 2.0 and r["speedup_vs_padded"] == 3.0
    table = compact_table(records, [pol], [r])
    assert "2.00" in table and "3.00" in table and "not ok: {'error': 1}" in table
    md = markdown({"records": records, "config": {"policies": [pol]}, "gpu": "test"})
    assert "| ort_raggedvit | topk-l2:keep=0.5:at=4 | 99 | 3,000 |" in md
    assert "| torch_varlen | topk-l2:keep=0.5:at=4 | 99 | err |" in md
    assert "**2.00×**" in md and "**3.00×**" in md


def test_dead_worker_becomes_error_records(tmp_path, monkeypatch) -> None:
    import subprocess
    import time

    from benchmarks.e2e import driver

    cfg = BenchConfig(device="cpu", dtype="fp32", models=("deit_tiny",), sizes=(224,), batches=(1,))
    done = _rec("timm_eager_fp16", "none", 1, 10.0)

    def crashed_worker(cmd, timeout):
        part = tmp_path / "deit_tiny_224.json"
        assert cmd[cmd.index("--worker-out") + 1] == str(part) and timeout > 0
        part.write_text(json.dumps({"records": [done], "profiles": [], "exports": [], "done": False}))
        return subprocess.CompletedProcess(cmd, -11)

    monkeypatch.setattr(driver.subprocess, "run", crashed_worker)
    sink = driver._spawn(cfg, "deit_tiny", 224, time.time() + 100, tmp_path)
    assert sink["records"][0] == done
    rest = sink["records"][1:]
    assert len(rest) == len(BASELINES) - 1 + 2 * len(PRUNED)  # the other baselines + every pruned variant x 2 policies
    assert all(r["status"] == "error" and "rc=-11" in r["error"] for r in rest)


def test_kernel_categories_of_raggedvit_kernels() -> None:
    from benchmarks.e2e.profile import _kernel_category

    assert _kernel_category("_ragged_linear_tma") == _kernel_category("_ragged_linear") == "gemm"
    assert _kernel_category("_patch_embed") == "gemm"
    assert _kernel_category("_ragged_attn_fwd") == _kernel_category("_ragged_cls_attn") == "ragged_attention"
    assert _kernel_category("_gather_layer_norm") == "layernorm" and _kernel_category("_bias_gelu") == "gelu"
