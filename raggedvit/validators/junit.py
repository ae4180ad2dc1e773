"""A validation report as JUnit XML (the test tabs of CI systems) and as a GitHub Actions step summary."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path

from raggedvit.outputs import atomic_write
from raggedvit.validators.report import ValidationReport

__all__ = ["append_step_summary", "junit_xml", "write_junit"]


def junit_xml(report: ValidationReport) -> str:
    """One <testsuite> of one <testcase> per image (failed: its failures, the first failing block first; skipped:
    a near-tie or precision tie, not judged), one for the structural check (when it ran; failed: its mismatches) and
    one for the rule as a whole (failed when the validation failed)."""
    model = Path(report.model).name
    suite = ET.Element("testsuite", name=f"raggedvit validate {model}")
    cases = 0
    failed = 0
    skipped = 0
    for row in report.rows:
        case = ET.SubElement(
            suite, "testcase", classname=f"raggedvit.validate.{model}", name=f"image {row.index} ({row.name})"
        )
        cases += 1
        mine = [f for f in report.failures if f.image == row.index]
        if mine:
            failed += 1
            node = ET.SubElement(case, "failure", message=mine[0].message, type=mine[0].kind)
            node.text = "\n".join(f.line() for f in mine)
        elif row.near_tie or row.precision_tie:
            skipped += 1
            what = "a near-tie at a pruning cut" if row.near_tie else "a precision tie (a moved cut within precision)"
            ET.SubElement(case, "skipped", message=f"not judged: {what}")
    if report.structure is not None:  # the graph's attributes against the reference's modules
        case = ET.SubElement(suite, "testcase", classname=f"raggedvit.validate.{model}", name="structure")
        cases += 1
        bad = [f for f in report.failures if f.kind == "structure"]
        if bad:
            failed += 1
            node = ET.SubElement(case, "failure", message=bad[0].message, type="structure")
            node.text = "\n".join(f.message for f in bad)
        ET.SubElement(case, "system-out").text = report.structure.summary()
    rule = ET.SubElement(suite, "testcase", classname=f"raggedvit.validate.{model}", name="validation rule")
    cases += 1
    if not report.passed:
        failed += 1
        whole = [f for f in report.failures if f.image is None]
        first = (whole or report.failures)[0]
        summary = report.block_summary()
        message = first.message + (f" ({summary})" if summary and first.kind == "block_drift" else "")
        node = ET.SubElement(rule, "failure", message=message, type=first.kind)
        node.text = "\n".join(f.line() for f in report.failures)
    out = ET.SubElement(rule, "system-out")
    out.text = report.to_markdown()
    suite.set("tests", str(cases))
    suite.set("failures", str(failed))
    suite.set("errors", "0")
    suite.set("skipped", str(skipped))
    root = ET.Element("testsuites", name="raggedvit validate", tests=str(cases), failures=str(failed))
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_junit(report: ValidationReport, path: str | Path) -> Path:
    """Write `junit_xml(report)` to `path` atomically."""
    return atomic_write(Path(path), junit_xml(report))


def append_step_summary(report: ValidationReport, environ: dict[str, str] | None = None) -> Path | None:
    """Append the Markdown report to the file named by GITHUB_STEP_SUMMARY (GitHub Actions shows it on the run's
    page); None when the variable is unset or empty."""
    target = (environ if environ is not None else os.environ).get("GITHUB_STEP_SUMMARY")
    if not target:
        return None
    with open(target, "a", encoding="utf-8") as f:
        f.write(report.to_markdown() + "\n")
    return Path(target)
