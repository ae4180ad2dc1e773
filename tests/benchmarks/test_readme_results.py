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
