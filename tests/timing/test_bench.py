"""raggedvit.timing.bench / `raggedvit bench` on the CPU EP with a small pruned export."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from raggedvit.exporter import export_onnx
from raggedvit.exporter.metadata import read_recipe
from raggedvit.images import preprocess, sample_images
from raggedvit.pruning import PruneSpec
from raggedvit.timing.bench import bench_inputs, bench_onnx
from raggedvit.weights import load_vit
from tests.support.cli import run_cli


@pytest.fixture(scope="module")
def small_export(tmp_path_factory):
    vit, _ = load_vit("deit_tiny_patch16_224", seed=0, model_kwargs={"depth": 4})
    spec = PruneSpec.from_strings("topk-l2", prune_at="2", keep=0.5)
    path = tmp_path_factory.mktemp("bench") / "tiny.onnx"
    return export_onnx(vit, spec, path, recipe={"model": "deit_tiny_patch16_224"})


def test_bench_onnx_reports_every_batch(small_export):
    results = bench_onnx(small_export, device="cpu", batches=(1, 3), seconds=0.05, warmup=1)
    assert [r.batch for r in results] == [1, 3]
    for r in results:
        assert r.latency_ms > 0 and r.img_per_s == pytest.approx(r.batch / (r.latency_ms / 1e3))
        assert r.runs >= 3 and r.p10_ms <= r.latency_ms <= r.p90_ms  # raggedvit.timing.measure's statistics
        # one stage keeping ceil(0.5 * 196) = 98 patch tokens + the class token
        assert r.mean_tokens == [99.0]


def test_bench_inputs_are_the_photos_through_timms_transform(small_export):
    """bench times the photos exactly as validate feeds them: timm's data config of the recipe's model."""
    recipe = read_recipe(small_export)
    vit, _ = load_vit("deit_tiny_patch16_224", seed=0, model_kwargs={"depth": 4})
    assert torch.equal(bench_inputs(recipe), preprocess(sample_images(), vit))
    noise = bench_inputs(recipe, random=True)
    assert noise.shape == (4, 3, 224, 224) and torch.equal(noise, bench_inputs(recipe, random=True))


def test_cli_bench_writes_json_and_plot(small_export, tmp_path):
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    res = run_cli(
        "bench", str(small_export), "--batch", "1,2", "--seconds", "0.05", "--json", str(out), "--plot", str(png)
    )
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    assert data["device"] == "cpu" and [r["batch"] for r in data["results"]] == [1, 2]
    assert "img/s" in res.stdout and f"wrote {png}" in res.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_results_draws_img_per_s_per_batch(tmp_path):
    from PIL import Image

    from raggedvit.timing.bench import BenchResult, plot_results

    results = [BenchResult(b, 2.0 * b, 500.0, 10, [99.0], 1.9 * b, 2.2 * b) for b in (32, 1, 4)]
    path = plot_results(results, tmp_path / "p.png", title="tiny.onnx")
    with Image.open(path) as im:
        assert im.format == "PNG" and im.size == (720, 480)
        lo, hi = im.convert("L").getextrema()
        assert lo < 100 and hi == 255  # dark lines and text on a white figure
    with pytest.raises(ValueError, match="no results"):
        plot_results([], tmp_path / "q.png")


def test_cli_bench_plot_without_matplotlib_fails_before_timing(small_export, tmp_path, monkeypatch):
    """Without matplotlib (an optional extra), --plot stops at once with one error line naming the extra."""
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")] or ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)  # an import of any of them raises ImportError
    res = run_cli("bench", str(small_export), "--plot", str(tmp_path / "p.png"))
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip() == "error: --plot needs matplotlib: pip install 'raggedvit[images]' (or matplotlib)"
    assert not (tmp_path / "p.png").exists()


@pytest.fixture
def no_photos(monkeypatch):
    import raggedvit.images

    monkeypatch.setattr(raggedvit.images, "sample_images", lambda: [])


def test_cli_bench_without_photos_says_so(small_export, no_photos):
    """No silent noise: without sample photos bench stops with one error line naming --random (exit 2)."""
    res = run_cli("bench", str(small_export), "--batch", "1", "--seconds", "0.01")
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().startswith("error: no sample images available") and "--random" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_cli_bench_random_runs_without_photos(small_export, tmp_path, no_photos):
    out = tmp_path / "bench.json"
    res = run_cli("bench", str(small_export), "--batch", "1", "--seconds", "0.01", "--random", "--json", str(out))
    assert res.returncode == 0, res.stderr
    assert json.loads(out.read_text())["inputs"] == "random"


def test_cli_bench_rejects_bad_batch(small_export, tmp_path):
    res = run_cli("bench", str(small_export), "--batch", "0,x")
    assert res.returncode == 2
    assert res.stderr.strip().startswith("error: --batch must be")
    assert len(res.stderr.strip().splitlines()) == 1


def test_cli_bench_cuda_graph_needs_cuda_device(small_export):
    proc = run_cli("bench", str(small_export), "--cuda-graph")
    assert proc.returncode == 2 and "--cuda-graph needs --device cuda" in proc.stderr


@pytest.mark.gpu
def test_bench_cuda_graph_on_gpu(small_export):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    plain = bench_onnx(small_export, device="cuda", batches=(2,), seconds=0.05, warmup=1)
    graph = bench_onnx(small_export, device="cuda", batches=(2,), seconds=0.05, warmup=1, cuda_graph=True)
    assert graph[0].mean_tokens == plain[0].mean_tokens and graph[0].img_per_s > 0
