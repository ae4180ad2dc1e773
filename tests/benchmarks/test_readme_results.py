"""The results sections of README.md and docs/performance.md equal benchmarks.readme_results' output on the
committed result files (CPU, no GPU: the generator reads JSON only)."""

from __future__ import annotations

import pytest

from benchmarks.readme_results import DOCUMENTS, ROOT, SECTIONS, render, rendered


@pytest.mark.parametrize("doc", sorted(DOCUMENTS))
def test_documents_match_the_result_files(doc: str) -> None:
    text, new = rendered(doc)
    assert new == text, f"{doc} is out of date: run python3 -m benchmarks.readme_results"


@pytest.mark.parametrize("doc", sorted(DOCUMENTS))
def test_documents_carry_marked_sections(doc: str) -> None:
    text = (ROOT / doc).read_text()
    assert any(f"<!-- results:{name} -->" in text for name in SECTIONS)


def test_every_benchmark_has_a_section_in_the_performance_page() -> None:
    text = (ROOT / "docs/performance.md").read_text()
    for name in SECTIONS:
        assert f"<!-- results:{name} -->" in text and f"<!-- /results:{name} -->" in text


def test_render_replaces_only_the_marked_body() -> None:
    doc = "before\n<!-- results:validate -->\nstale\n<!-- /results:validate -->\nafter\n"
    out = render(doc, full=False, prefix="")
    assert out.startswith("before\n<!-- results:validate -->\n") and out.endswith("<!-- /results:validate -->\nafter\n")
    assert "stale" not in out and "| fp32 | topk-l2 |" in out
    assert render(out, full=False, prefix="") == out  # idempotent


def test_unknown_section_is_an_error() -> None:
    with pytest.raises(KeyError):
        render("<!-- results:nope -->\n<!-- /results:nope -->", full=False, prefix="")


def test_charts_point_at_committed_files() -> None:
    for doc in DOCUMENTS:
        _, new = rendered(doc)
        prefix = "../" * doc.count("/")
        for line in new.splitlines():
            if line.startswith("![") and "benchmarks/results/" in line:
                target = line[line.index("(") + 1 : line.rindex(")")]
                assert (ROOT / doc).parent.joinpath(target).resolve().is_file(), (doc, target, prefix)


def test_tome_table_from_a_serving_tome_file() -> None:
    """The tome section's table and bar line on hand-made records (no GPU file is committed yet): img/s with the
    ratio to the unpruned export, GPU µs in the full table, the bars met and the ones missed."""
    from benchmarks.readme_results import tome_table

    def rec(variant, policy, batch, img_per_s, gpu_us):
        return {"model": "deit_small", "variant": variant, "policy": policy, "batch": batch, "status": "ok",
                "img_per_s": img_per_s, "gpu_us_per_image": gpu_us}  # fmt: skip

    data = {
        "records": [rec("ort_unpruned", "none", 1, 2000.0, 300.0), rec("ort_raggedvit", "tome:r=8", 1, 1800.0, 290.0),
                    rec("ort_unpruned", "none", 32, 20000.0, 40.0), rec("ort_raggedvit", "tome:r=8", 32, 25000.0, 33.0),
                    rec("timm_eager", "none", 32, 9000.0, 90.0)],  # fmt: skip
        "tome_targets": [
            {"model": "deit_small", "r": 8, "batch": 1, "bars": {"not_slower_at_b1": {"met": False}}},
            {"model": "deit_small", "r": 8, "batch": 32,
             "bars": {"gpu_time_vs_flops": {"limit_us": 34.2, "met": True}}},  # fmt: skip
        ],
    }
    short = tome_table(data, full=False)
    assert short[:4] == [
        "| model | export | B=1 | B=32 |",
        "|---|---|---:|---:|",
        "| deit_small | unpruned | 2,000 | 20,000 |",
        "| deit_small | tome r=8 | 1,800 (0.90x) | 25,000 (1.25x) |",
    ]
    assert short[-1] == "Token-merging bars: 1 of 2 met. Missed: deit_small r=8 B=1 (not slower at B=1)."
    full = tome_table(data, full=True)
    assert full[3] == "| deit_small | tome r=8 | 1,800 (0.90x); 290.0 µs | 25,000 (1.25x); 33.0 µs |"
    assert full[-2:] == ["- deit_small r=8 B=1, not slower at B=1: **missed**",
                         "- deit_small r=8 B=32, GPU time <= 1.15 x FLOPs share: met"]  # fmt: skip


def test_merge_kernel_table_from_records() -> None:
    from benchmarks.readme_results import merge_kernel_table

    recs = [
        {"impl": "triton_merge", "dtype": "float16", "B": 32, "gpu_us": 20.0, "speedup_vs_reference": 15.0,
         "gbps": 1200.0, "src_equal": True},
        {"impl": "torch_reference", "dtype": "float16", "B": 32, "gpu_us": 300.0},
        {"impl": "triton_merge", "dtype": "float32", "B": 1, "gpu_us": None, "src_equal": False},
        {"impl": "torch_reference", "dtype": "float32", "B": 1, "gpu_us": 90.0},
    ]  # fmt: skip
    assert merge_kernel_table({"records": recs})[2:] == [
        "| float16 | 32 | 20.0 µs | 300.0 µs | 15.0x | 1200 | yes |",
        "| float32 | 1 | failed | 90.0 µs |  |  | **no** |",
    ]
