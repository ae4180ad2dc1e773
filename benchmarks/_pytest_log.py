"""A pytest plugin that appends one JSON line per test phase report to $RAGGEDVIT_TEST_LOG, as each phase ends.

    RAGGEDVIT_TEST_LOG=chunk.jsonl python3 -m pytest -p benchmarks._pytest_log ...

Used by `benchmarks.gpu_tests run`: a chunk that is cut (SIGINT, SIGKILL, the call's time limit) keeps every test
that finished, since each line is written and flushed when its phase ends. Under pytest-xdist only the controller
writes (the workers' reports reach it through pytest_runtest_logreport), so every phase is written once.
Each line: {"nodeid", "when" (setup / call / teardown), "outcome" (passed / failed / skipped), "duration" (s)}.
"""

from __future__ import annotations

import json
import os

import pytest

_worker = False  # this process is a pytest-xdist worker of the run that loaded the plugin


def pytest_configure(config: pytest.Config) -> None:
    global _worker
    _worker = hasattr(config, "workerinput")  # not the environment: a run started from inside a worker inherits it


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = os.environ.get("RAGGEDVIT_TEST_LOG")
    if not path or _worker:
        return
    line = {"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome, "duration": report.duration}
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")
        f.flush()
