"""raggedvit.coverage: one representative per family passes all three columns; the runner survives timeouts;
the report and the `coverage` command (click's runner in this process; each model in a child, failing cases
included)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from raggedvit.coverage import CoverageReport, eta_seconds, merge_reports, parse_shard, run_coverage
from raggedvit.coverage.model import check_model
from tests.support.cli import CliResult, run_cli

pytestmark = pytest.mark.slow  # seconds a test: scheduled first (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]
IMG = 64  # small images: every representative accepts img_size

# One per family PrunedViT runs. No registered timm name has qk_norm on the plain Block (the *_xp_* models use
# ParallelScalingBlock), so the qk-norm representative is a ViT built with qk_norm=True.
REPRESENTATIVES = [
    ("deit_base_patch16_224", {}),
    ("deit_tiny_distilled_patch16_224", {}),
    ("vit_base_patch32_clip_quickgelu_224", {}),  # QuickGELU, pre-norm, no patch bias
    ("vit_base_patch16_siglip_gap_224", {}),  # GELUTanh, avg pool, no class token, headless
    ("vit_base_patch16_siglip_224", {}),  # MAP head (AttentionPoolLatent over the kept rows), headless
    ("vit_small_patch14_dinov2", {}),  # LayerScale, headless
    ("vit_small_patch14_reg4_dinov2", {}),  # registers
    ("aimv2_large_patch14_224", {}),  # RmsNorm, SwiGLU, no class token
    ("vit_small_patch16_224", {"qk_norm": True}),
    ("cait_xxs24_224", {}),  # talking-heads patch blocks (no class token), class-attention tail
    ("beit_base_patch16_224", {}),  # relative position bias per block, q/v bias, gamma layer scale, avg + fc_norm
    ("vit_relpos_small_patch16_224", {}),  # RelPosMlp, no class token
    ("vit_relpos_medium_patch16_rpn_224", {}),  # ResPostRelPosBlock
    ("vit_relpos_medium_patch16_cls_224", {}),  # RelPosMlp with a class token, token pool
    ("eva02_tiny_patch14_224", {}),  # Eva: axial rope, fused qkv with q/v bias, SwiGLU (GluMlp), avg pool
    ("vit_small_patch16_rope_mixed_224", {}),  # Eva: per-block per-head mixed rope, AttentionRope, LayerScale
    ("vit_small_patch16_dinov3", {}),  # Eva: DINOv3 rope (rotate-half), 4 registers, dynamic-size patch embedding
]
NO_CLASS_TOKEN = ("siglip", "aimv2", "cait", "vit_relpos_small", "_rpn_")  # evit ranks by the class token


@pytest.mark.parametrize("name,kwargs", REPRESENTATIVES, ids=[n + ("-qknorm" if k else "") for n, k in REPRESENTATIVES])
def test_representative_runs_exports_matches(name, kwargs):
    rec = check_model(name, depth=2, img_size=IMG, kwargs=kwargs)
    assert rec["img_size"][0] <= IMG, rec["img_size"]
    for column in ("runs", "exports", "matches"):
        assert rec[column] is True, f"{column}: {rec.get(f'{column}_error')}"
    policies = {"none", "topk-l2"} | ({"cls-mass"} if rec["has_class_token"] else set())
    assert set(rec["policies"]) == policies
    assert all(p["ok"] and p["rel"] <= 1e-4 for p in rec["policies"].values())
    topk = rec["policies"]["topk-l2"]
    assert topk["token_counts"] == topk["ref_token_counts"]


def test_unsupported_model_is_a_row_with_its_reason():
    rec = check_model("xcit_nano_12_p16_224", depth=2, img_size=IMG)
    assert rec["runs"] is False and rec["exports"] is None and rec["matches"] is None
    assert rec["runs_error"].startswith("check_supported: ValueError: expected a timm ")
    assert "VisionTransformer" in rec["runs_error"] and rec["runs_error"].endswith(", got Xcit")
    assert rec["family"] == "xcit"


def test_build_failure_is_a_row():
    rec = check_model("deit_tiny_patch16_224", depth=2, img_size=IMG, kwargs={"no_such_argument": 1})
    assert rec["runs"] is False and rec["runs_error"].startswith("meta build: TypeError")


def test_timeout_kills_the_child_and_names_the_step():
    report = run_coverage(models=["deit_tiny_patch16_224"], img_size=IMG, timeout_s=0.5)
    (rec,) = report.models
    assert rec["runs"] is False and "timeout after 0.5 s" in rec["runs_error"], rec


def test_markdown_totals_families_and_reasons():
    models = [
        {"name": "a", "family": "vision_transformer", "runs": True, "exports": True, "matches": True},
        {"name": "b", "family": "vision_transformer", "runs": True, "exports": False, "exports_error": "x | y"},
        {"name": "c", "family": "cait", "runs": False, "runs_error": "check_supported: no", "kwargs": {"k": 1}},
    ]
    meta = {
        "date": "d",
        "timm": "t",
        "torch": "p",
        "onnxruntime": "o",
        "raggedvit": "r",
        "filter": "*",
        "names_listed": 5,
        "depth": 2,
        "img_size_cap": 224,
        "timeout_s": 120.0,
        "match_rtol": 1e-4,
    }
    report = CoverageReport(meta, models, [{"name": "z", "error": "boom"}])
    assert report.totals() == {"vit_like": 3, "runs": 2, "exports": 1, "matches": 1}
    assert report.families() == {
        "vision_transformer": {"vit_like": 2, "runs": 2, "exports": 1, "matches": 1},
        "cait": {"vit_like": 1, "runs": 0, "exports": 0, "matches": 0},
    }
    md = report.to_markdown()
    assert "3 ViT-like among the 5 names of `timm.list_models()` matching `*`" in md
    assert "| ViT-like | 3 |" in md and "| PrunedViT runs | 2 (67 %) |" in md
    assert "| `b` | vision_transformer | – | yes | **no** | – | – | exports: x \\| y |" in md
    assert "| `c (k=1)` | cait |" in md and "## Not built on the meta device" in md


def cli(*args: str) -> CliResult:
    """`raggedvit coverage ARGS` in this process (click's runner); its per-model children import this checkout."""
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "RAGGEDVIT_DEBUG")}
    os.environ["PYTHONPATH"] = str(ROOT) + os.pathsep + (saved["PYTHONPATH"] or "")
    os.environ.pop("RAGGEDVIT_DEBUG", None)
    try:
        return run_cli("coverage", *args)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_cli_writes_table_and_json(tmp_path):
    out, js = tmp_path / "docs" / "coverage.md", tmp_path / "cov.json"
    res = cli("--filter", "xcit_nano_12_p16_224,resnet18", "--img-size", str(IMG), "--out", str(out), "--json", str(js))
    assert res.returncode == 0, res.stderr
    assert f"wrote {out} and {js}: 1 ViT-like, 0 run in PrunedViT" in res.stdout
    assert "[1/1] xcit_nano_12_p16_224: runs=FAIL exports=- matches=-" in res.stderr
    data = json.loads(js.read_text())
    assert data["totals"] == {"vit_like": 1, "runs": 0, "exports": 0, "matches": 0}
    assert data["meta"]["depth"] == 2 and data["meta"]["filter"] == "xcit_nano_12_p16_224,resnet18"
    assert data["meta"]["names_listed"] == 2
    assert "| `xcit_nano_12_p16_224` | xcit | 64x64 | **no** | – | – |" in out.read_text()


def test_parse_shard_and_eta():
    assert parse_shard("1/4") == (1, 4) and parse_shard("4/4") == (4, 4)
    for bad in ("0/4", "5/4", "1", "a/b", "1/2/3"):
        with pytest.raises(ValueError, match="shard must be K/N"):
            parse_shard(bad)
    assert eta_seconds(2, 10, 30.0) == pytest.approx(120.0)
    assert eta_seconds(10, 10, 30.0) == 0.0


def _shard(k: int, n: int, names: list[str], wall_s: float) -> CoverageReport:
    meta = {"shard": f"{k}/{n}", "wall_s": wall_s, "depth": 2}
    return CoverageReport(meta, [{"name": m, "runs": True} for m in names], [{"name": "broken", "error": "x"}])


def test_merge_reports_restores_the_unsharded_order():
    names = [f"m{i}" for i in range(7)]
    parts = [_shard(k, 3, names[k - 1 :: 3], wall_s=float(k)) for k in (2, 3, 1)]  # any order of the files
    merged = merge_reports(parts)
    assert [m["name"] for m in merged.models] == names
    assert merged.meta["shards"] == 3 and merged.meta["wall_s"] == 3.0 and "shard" not in merged.meta
    assert merged.not_built == [{"name": "broken", "error": "x"}]
    with pytest.raises(ValueError, match="shards 1/N .. N/N"):
        merge_reports(parts[:2])
    with pytest.raises(ValueError, match="shards 1/N .. N/N"):
        merge_reports([_shard(1, 2, ["a"], 1.0), _shard(2, 3, ["b"], 1.0)])


def test_cli_shards_and_merge(tmp_path):
    """--shard K/N checks every N-th model from the K-th; --merge joins the shards' JSON files into the unsharded
    table (timm's listing order)."""
    names = ["xcit_nano_12_p8_224", "xcit_nano_12_p16_224"]
    shards = []
    for k in (1, 2):
        js = tmp_path / f"shard{k}.json"
        res = cli("--filter", ",".join(names), "--img-size", str(IMG), "--shard", f"{k}/2",
                  "--out", str(tmp_path / f"{k}.md"), "--json", str(js))  # fmt: skip
        assert res.returncode == 0, res.stderr
        assert f"[1/1] {names[k - 1]}: runs=FAIL" in res.stderr
        assert json.loads(js.read_text())["meta"]["shard"] == f"{k}/2"
        shards.append(js)
    out, js = tmp_path / "all.md", tmp_path / "all.json"
    res = cli("--merge", str(shards[1]), "--merge", str(shards[0]), "--out", str(out), "--json", str(js))
    assert res.returncode == 0, res.stderr
    assert [m["name"] for m in json.loads(js.read_text())["models"]] == names
    assert f"wrote {out} and {js}: 2 ViT-like" in res.stdout
    res = cli("--merge", str(shards[0]), "--out", str(out))
    assert res.returncode == 2 and "error: --merge: expected the reports of shards" in res.stderr


def test_cli_progress_lines_carry_an_eta(tmp_path, monkeypatch):
    from click.testing import CliRunner

    import raggedvit.coverage as cov
    from raggedvit.cli import main

    def fake_run(pattern, *, progress, **_):
        models = [{"name": f"m{i}", "runs": True, "exports": True, "matches": False, "wall_s": 5.0} for i in range(3)]
        for i, rec in enumerate(models, 1):
            progress(i, 3, rec, 50.0 * i)
        return CoverageReport({"wall_s": 150.0}, models)

    monkeypatch.setattr(cov, "run_coverage", fake_run)
    monkeypatch.setattr(cov.CoverageReport, "to_markdown", lambda self: "table\n")  # the table is tested above
    res = CliRunner().invoke(main, ["coverage", "--out", str(tmp_path / "c.md")])
    assert res.exit_code == 0, res.output
    assert "[1/3] m0: runs=ok exports=ok matches=FAIL (5 s, ETA 1 min 40 s)" in res.output
    assert "[2/3] m1: runs=ok exports=ok matches=FAIL (5 s, ETA 50 s)" in res.output
    assert "[3/3] m2: runs=ok exports=ok matches=FAIL (5 s)\n" in res.output


@pytest.mark.parametrize(
    "args,fragment",
    [
        (("--shard", "0/4"), "--shard must be K/N with 1 <= K <= N"),
        (("--depth", "1"), "--depth at least 2"),
        (("--jobs", "0"), "must be positive"),
        (("--filter", "no_such_model*"), "no ViT-like timm model matches --filter 'no_such_model*'"),
    ],
)
def test_cli_input_errors_exit_2(tmp_path, args, fragment):
    out = tmp_path / "c.md"
    res = cli(*args, "--out", str(out))
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2, res.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], res.stderr
    assert not out.exists()


# evit's own paths: its ranking by the class token's attention over the prefix tokens, and the fused token's place
# in what follows a stage (relative position biases, ropes). The class-token families whose blocks add nothing to
# those paths (deit_base, CLIP's QuickGELU, DINOv2 without registers, qk-norm) run the other policies above.
EVIT_REPRESENTATIVES = [
    "deit_tiny_distilled_patch16_224",  # two prefix tokens
    "vit_small_patch14_reg4_dinov2",  # registers, LayerScale
    "beit_base_patch16_224",  # relative position bias per block
    "vit_relpos_medium_patch16_cls_224",  # RelPosMlp with a class token
    "eva02_tiny_patch14_224",  # axial rope
    "vit_small_patch16_rope_mixed_224",  # mixed rope
    "vit_small_patch16_dinov3",  # rotate-half rope, registers
]


def test_evit_representatives_are_representatives():
    assert set(EVIT_REPRESENTATIVES) <= {n for n, _ in REPRESENTATIVES}


@pytest.mark.parametrize(
    "name,kwargs",
    [r for r in REPRESENTATIVES if r[0] in EVIT_REPRESENTATIVES],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_representative_evit_policies_match(name, kwargs, tmp_path):
    """evit with and without fuse (not in the coverage columns): the export equals PrunedViT, counts included."""
    assert not any(k in name for k in NO_CLASS_TOKEN)
    import numpy as np
    import torch

    from raggedvit.coverage.model import reduced_model
    from raggedvit.exporter import export_onnx
    from raggedvit.pruning import PrunedViT, PruneSpec
    from raggedvit.runtime import create_session

    vit, info = reduced_model(name, depth=3, img_size=IMG, kwargs=kwargs)
    vit.eval()
    h, w = info["img_size"]
    x = torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(0))
    for spec in (PruneSpec("evit", (1,), keep=0.6), PruneSpec("evit", (1, 2), keep=0.7, fuse=True)):
        path = export_onnx(vit, spec, tmp_path / f"{spec.fuse}.onnx")
        got = create_session(path).run(None, {"images": x.numpy()})
        with torch.no_grad():
            ref = PrunedViT(vit, spec)(x)
        np.testing.assert_array_equal(got[1], ref.token_counts.numpy())
        scale = max(float(ref.logits.abs().max()), 1e-6)
        assert float(np.abs(got[0] - ref.logits.numpy()).max()) <= 1e-4 * scale
