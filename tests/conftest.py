"""Fixtures shared by every test package."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch


@pytest.fixture
def gen(request: pytest.FixtureRequest) -> Iterator[torch.Generator]:
    """A generator with a fresh seed per test (printed, so a failure can be replayed with RAGGEDVIT_SEED)."""
    seed = int(os.environ.get("RAGGEDVIT_SEED", int.from_bytes(os.urandom(4), "little")))
    print(f"seed={seed} (replay: RAGGEDVIT_SEED={seed})")
    request.node.user_properties.append(("seed", seed))
    yield torch.Generator().manual_seed(seed)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked slow run first. Under -n, pytest-xdist hands out work in this order (the xdist_group modules
    before it: --dist loadgroup orders scopes by their number of tests), so short tests fill the end of the run and
    both workers finish close together."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: the order within each part stays


def pytest_terminal_summary(terminalreporter) -> None:
    """Prints the ("ci_summary", text) user properties of passed and failed tests (e.g. the fuzz call counts),
    also under pytest-xdist, where test output is not shown."""
    lines = [
        f"{report.nodeid}: {value}"
        for key in ("passed", "failed")
        for report in terminalreporter.stats.get(key, [])
        if report.when == "call"
        for name, value in getattr(report, "user_properties", [])
        if name == "ci_summary"
    ]
    if lines:
        terminalreporter.write_sep("=", "raggedvit summaries")
        for line in lines:
            terminalreporter.write_line(line)
