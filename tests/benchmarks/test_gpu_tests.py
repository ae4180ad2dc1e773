"""benchmarks.gpu_tests: a pytest JUnit XML of the GPU suite -> the record, its checks and its README line."""

from __future__ import annotations

import json
import os

import pytest

from benchmarks.gpu_tests import (
    ROOT,
    collect,
    main,
    merge,
    partition,
    problems,
    read_chunk,
    read_junit,
    record,
    run_chunk,
)
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
    assert main(["junit", str(tmp_path / "x.xml"), "--out", str(tmp_path / "out"), "--gpu", GPU]) == 1  # the error case
    path = tmp_path / "out" / "gpu_tests_NVIDIA-H100-80GB-HBM3.json"
    data = json.loads(path.read_text())
    assert data["suite"]["errors"] == 1 and "errored: tests/conftest.py::test_w" in capsys.readouterr().out
    lines = gpu_tests_lines(data, path.name, full=True)
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


def test_partition_balances_recorded_durations_and_keeps_order():
    ids = [f"t{i}" for i in range(6)]
    durations = {"t0": 10.0, "t1": 1.0, "t2": 9.0, "t3": 1.0, "t4": 1.0}  # t5 unknown: the median, 1 s
    chunks = partition(ids, durations, 2)
    assert sorted(sum(chunks, [])) == ids and all(c == sorted(c) for c in chunks)
    loads = [sum(durations.get(i, 1.0) for i in c) for c in chunks]
    assert loads == [12.0, 11.0]  # t0 then t2 onto the lighter chunk, then the 1 s tests
    assert partition(ids, {}, 1) == [ids] and partition(ids, {}, 3) == [["t0", "t3"], ["t1", "t4"], ["t2", "t5"]]
    with pytest.raises(ValueError):
        partition(ids, {}, 0)


def _chunk(folder, k, n, ids, lines, status="complete"):
    folder.mkdir(parents=True, exist_ok=True)
    env = {
        "date": "2026-12-07T10:00:00+00:00",
        "gpu": {"name": GPU},
        "packages": {"torch": "2.11", "onnxruntime-gpu": "1.31.1"},
    }
    summary = {
        "chunk": k,
        "of": n,
        "ids": ids,
        "status": status,
        "returncode": 0,
        "seconds": 100.0,
        "commit": "0123456789abcdef",
        "env": env,
    }
    (folder / f"chunk-{k}-of-{n}.json").write_text(json.dumps(summary))
    text = "".join(json.dumps(dict(zip(("nodeid", "when", "outcome", "duration"), line))) + "\n" for line in lines)
    (folder / f"chunk-{k}-of-{n}.jsonl").write_text(text)


def test_merge_of_two_chunks_one_cut(tmp_path):
    a = ["tests/a.py::p", "tests/a.py::f", "tests/a.py::e", "tests/a.py::s"]
    _chunk(tmp_path / "one", 1, 2, a, [
        ("tests/a.py::p@grp", "setup", "passed", 1.0), ("tests/a.py::p@grp", "call", "passed", 2.0),
        ("tests/a.py::p@grp", "teardown", "passed", 0.5),
        ("tests/a.py::f", "setup", "passed", 0), ("tests/a.py::f", "call", "failed", 3),
        ("tests/a.py::f", "teardown", "passed", 0),
        ("tests/a.py::e", "setup", "failed", 1),
        ("tests/a.py::s", "setup", "skipped", 0),
    ])  # fmt: skip
    b = ["tests/b.py::done", "tests/b.py::cut", "tests/b.py::never"]
    _chunk(tmp_path / "two", 2, 2, b, [
        ("tests/b.py::done", "setup", "passed", 0), ("tests/b.py::done", "call", "passed", 7),
        ("tests/b.py::done", "teardown", "passed", 0),
        ("tests/b.py::cut", "setup", "passed", 0),
    ], status="cut")  # fmt: skip
    data = merge([tmp_path / "one", tmp_path / "two"])
    s = data["suite"]
    assert (s["passed"], s["failed"], s["errors"], s["skipped"], s["tests"]) == (2, 1, 1, 1, 5)
    assert s["failing"] == ["tests/a.py::f"] and s["erroring"] == ["tests/a.py::e"]
    assert s["not_run"] == ["tests/b.py::cut", "tests/b.py::never"]
    assert s["durations"]["tests/a.py::p"] == 3.5 and "tests/b.py::cut" not in s["durations"]
    assert [c["status"] for c in data["chunks"]] == ["complete", "cut"] and data["gpu"] == GPU
    assert problems(data) == [
        "chunks not complete: 2/2",
        "2 tests did not finish: tests/b.py::cut, tests/b.py::never",
        "1 failed and 1 errored: tests/a.py::f, tests/a.py::e",
    ]
    only_one = merge([tmp_path / "one"])
    assert "chunks missing: have [1] of [2]" in problems(only_one)


def test_merge_refuses_mixed_commits_and_empty_folders(tmp_path):
    _chunk(tmp_path / "one", 1, 2, [], [])
    _chunk(tmp_path / "two", 2, 2, [], [])
    (tmp_path / "two" / "chunk-2-of-2.json").write_text(
        (tmp_path / "two" / "chunk-2-of-2.json").read_text().replace("0123456789abcdef", "fedcba9876543210")
    )
    with pytest.raises(ValueError, match="differ in commit"):
        merge([tmp_path / "one", tmp_path / "two"])
    with pytest.raises(ValueError, match="no chunk"):
        merge([tmp_path / "empty"])


def test_run_chunk_cut_at_the_budget_keeps_what_finished(tmp_path, commit, monkeypatch):
    """A real pytest under the runner: the quick test finishes, the slow one is cut by SIGINT at the budget."""
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_x.py").write_text(
        "import time\nimport pytest\n\n@pytest.mark.gpu\ndef test_quick():\n    pass\n\n"
        "@pytest.mark.gpu\ndef test_slow():\n    time.sleep(600)\n"
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: gpu\n")
    ids = collect(None, root=tmp_path)
    assert ids == ["tests/test_x.py::test_quick", "tests/test_x.py::test_slow"]
    monkeypatch.setenv("PYTHONPATH", f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    summary = run_chunk(ids, tmp_path / "out", 1, 1, budget_s=25, workers=1, root=tmp_path)
    assert summary["status"] == "cut"
    _, outcomes = read_chunk(tmp_path / "out" / "chunk-1-of-1.json")
    assert outcomes["tests/test_x.py::test_quick"][0] == "passed"
    assert outcomes["tests/test_x.py::test_slow"][0] == "unfinished"
