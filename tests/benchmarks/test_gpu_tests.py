"""benchmarks.gpu_tests: a pytest JUnit XML of the GPU suite -> the record, its checks and its README line."""

from __future__ import annotations

import json

import pytest

from benchmarks.gpu_tests import main, problems, read_junit, record
from benchmarks.readme_results import gpu_tests_lines, validate_study_lines

GPU = "NVIDIA H100 80GB HBM3"


def _junit(path, *, failing: bool) -> None:
    fail = '<failure message="assert 0">tb</failure>' if failing else ""
    path.write_text(
        '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="0" failures="0" '
        'skipped="1" tests="4" time="444.2" timestamp="2026-12-05T10:00:00">'
        '<testcase classname="tests.validators.test_mutations" name="test_control_passes[cuda-fp16-all]" time="9">'
        f"{fail}</testcase>"
        '<testcase classname="tests.validators.test_mutations" name="test_control_passes[cuda-fp16]" time="9"/>'
        '<testcase classname="tests.kernels.test_x.TestY" name="test_z" time="1"><skipped message="no"/></testcase>'
        '<testcase classname="tests.conftest" name="test_w" time="1"><error message="boom"/></testcase>'
        "</testsuite></testsuites>"
    )


@pytest.fixture
def commit(monkeypatch):
    monkeypatch.setenv("RAGGEDVIT_COMMIT", "0123456789abcdef0123456789abcdef01234567")


def test_counts_and_node_ids(tmp_path):
    _junit(tmp_path / "x.xml", failing=True)
    suite = read_junit(tmp_path / "x.xml")
    assert (suite["passed"], suite["failed"], suite["errors"], suite["skipped"], suite["tests"]) == (1, 1, 1, 1, 4)
    assert suite["failing"] == ["tests/validators/test_mutations.py::test_control_passes[cuda-fp16-all]"]
    assert suite["erroring"] == ["tests/conftest.py::test_w"] and suite["seconds"] == 444.2


def test_a_record_with_failures_is_flagged_and_a_clean_one_is_not(tmp_path, commit):
    _junit(tmp_path / "bad.xml", failing=True)
    bad = problems(record(tmp_path / "bad.xml", gpu=GPU))
    assert bad == [
        "1 failed and 1 errored: tests/validators/test_mutations.py::test_control_passes[cuda-fp16-all], "
        "tests/conftest.py::test_w"
    ]
    good = tmp_path / "good.xml"
    _junit(good, failing=False)
    text = good.read_text().replace('<error message="boom"/>', "")
    good.write_text(text)
    data = record(good, gpu=GPU)
    assert problems(data) == [] and data["commit"].startswith("0123456") and data["gpu"] == GPU
    assert problems({**data, "gpu": "cpu"}) == ["no GPU named ('cpu')"]
    assert problems({**data, "suite": {**data["suite"], "passed": 5}}) == [
        "passed + failed + errors + skipped != tests: {'passed': 5, 'failed': 0, 'errors': 0, 'skipped': 1, 'tests': 4}"
    ]


def test_the_command_writes_the_canonical_file(tmp_path, commit, capsys):
    _junit(tmp_path / "x.xml", failing=False)
    assert main([str(tmp_path / "x.xml"), "--out", str(tmp_path / "out"), "--gpu", GPU]) == 1  # the error case
    path = tmp_path / "out" / "gpu_tests_NVIDIA-H100-80GB-HBM3.json"
    data = json.loads(path.read_text())
    assert data["suite"]["errors"] == 1 and "failing: tests/conftest.py::test_w" in capsys.readouterr().out
    lines = gpu_tests_lines(data, path.name, full=False)
    assert lines[0].startswith("Last GPU run, `python3 -m pytest -m gpu tests`: **failures**, 2 passed, 0 failed, 1 ")
    assert f"on {GPU}, raggedvit `0123456`" in lines[0] and lines[1:] == ["- failing: `tests/conftest.py::test_w`"]


def test_the_study_table():
    export = {"case": "deit_tiny_x", "model": "deit_tiny_patch16_224", "capacity": True, "dtype": "fp16",
              "prune": {"policy": "cls-mass", "prune_at": [3, 6, 9], "mass": 0.9}, "passed": True,
              "precision_ties": [{}], "max_block_ratio": 0.31, "failures": [], "failure_count": 0}  # fmt: skip
    first = "structure: block 0: norm epsilon 0.0001 in the export, 1e-06 in the reference"
    mutant = {"mutant": "layernorm_eps_x100", "dtype": "fp16", "caught": True, "named": True, "first_failure": first}
    data = {
        "device": GPU, "env": {"commit": "abc", "date": "2026-12-05"}, "timing": {"total_s": 400.0},
        "config": {"dtypes": ["fp16"], "device": "cuda", "image_names": ["a"] * 64},
        "totals": {"exports": 1, "false_failures": 0, "precision_ties": 1, "mutants": 1, "mutants_missed": 0,
                   "mutants_not_named": 0, "export_errors": 0},
        "exports": [export], "mutants": [mutant],
    }  # fmt: skip
    lines = validate_study_lines(data, "validate_study_x.json", full=True)
    assert "64 images" in lines[0] and "**0 false failures** in 1 clean exports" in lines[0]
    assert (
        "| deit_tiny_patch16_224 | cls-mass (capacity) | mass 0.9 at 3,6,9 | pass, 1 precision tie, 0.31x floor |"
        in lines
    )
    assert (
        "| layernorm_eps_x100 | caught: block 0: norm epsilon 0.0001 in the export, 1e-06 in the reference |" in lines
    )
