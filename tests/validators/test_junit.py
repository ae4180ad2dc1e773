"""JUnit XML and the GitHub step summary of a validation report (no model: a report built by hand)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from raggedvit.validators import Thresholds
from raggedvit.validators.junit import append_step_summary, junit_xml, write_junit
from raggedvit.validators.report import Failure, ImageRow, ValidationReport


def _row(i: int, name: str, drift: list[float], near_tie: bool = False) -> ImageRow:
    return ImageRow(i, name, 1e-6, 1e-7, 3, 3, [99], [99], near_tie, 2.0, block_drift=drift)


def _report() -> ValidationReport:
    th = Thresholds.for_dtype("fp32")
    rows = [_row(0, "cat", [3e-7, 3e-7]), _row(1, "dog", [3e-7, 2e-2]), _row(2, "tie", [3e-7, 3e-7], near_tie=True)]
    msg = "image 1 (dog): block 1 drifts 8e+04x its fp32 floor (drift 2.00e-02 > bar 1.08e-05); block 0 within 1.2x"
    return ValidationReport(
        model="/x/m.onnx",
        recipe={"model": "deit_tiny_patch16_224", "dtype": "fp32"},
        device="cpu",
        providers=["CPUExecutionProvider"],
        thresholds=th,
        rows=rows,
        failures=[Failure("block_drift", 1, msg)],
        block_floor=[2.6e-7, 2.6e-7],
    )


def test_junit_one_case_per_image_and_one_for_the_rule(tmp_path):
    report = _report()
    path = write_junit(report, tmp_path / "v.xml")
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    suite = root.find("testsuite")
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == ["image 0 (cat)", "image 1 (dog)", "image 2 (tie)", "validation rule"]
    assert suite.get("tests") == "4" and suite.get("failures") == "2" and suite.get("skipped") == "1"
    assert cases[0].find("failure") is None and cases[2].find("skipped") is not None
    failure = cases[1].find("failure")
    assert failure.get("type") == "block_drift" and "block 1 drifts" in failure.get("message")
    rule = cases[3].find("failure")
    assert (
        "block 1 drifts" in rule.get("message") and "## raggedvit validation: FAIL" in cases[3].find("system-out").text
    )
    assert junit_xml(report) == path.read_text()


def test_per_block_table_in_the_markdown():
    md = _report().to_markdown()
    assert "| block | max drift | fp32 floor | ratio | bar | images over |" in md
    assert "per block: drift ||Δh||/||h|| (kept rows) <= 3 x the block's fp32 floor + 1e-05: block 1 drifts" in md
    assert "block 0 within 1.2x" in md


def test_step_summary_appended_only_when_set(tmp_path):
    target = tmp_path / "summary.md"
    assert append_step_summary(_report(), {}) is None and not target.exists()
    append_step_summary(_report(), {"GITHUB_STEP_SUMMARY": str(target)})
    append_step_summary(_report(), {"GITHUB_STEP_SUMMARY": str(target)})
    assert target.read_text().count("## raggedvit validation: FAIL") == 2
