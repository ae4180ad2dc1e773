"""The raggedvit CLI run in this process through click's runner: the exit code, stdout and stderr a subprocess
would give, without starting Python (and importing torch) per call. The error contract is the same code either
way (`raggedvit.cli.app._Group.main`); the tests of the console entry point itself keep their subprocesses."""

from __future__ import annotations

import gc
from dataclasses import dataclass

__all__ = ["CliResult", "run_cli"]


@dataclass(frozen=True)
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def run_cli(*args: str) -> CliResult:
    """`raggedvit ARGS...` in this process; an exception the CLI does not map to an exit status propagates."""
    from click.testing import CliRunner

    from raggedvit.cli import main

    res = CliRunner().invoke(main, list(args), catch_exceptions=False, prog_name="raggedvit")
    if res.exit_code == 130:  # an interrupted command freezes the collector (its process ends at once): not this one
        gc.unfreeze()
    return CliResult(res.exit_code, res.stdout, res.stderr)
