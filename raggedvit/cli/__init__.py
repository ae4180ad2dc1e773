"""The raggedvit command line: the click group and core commands (`app`: export, validate, info), the tool commands
(`tools`: bench, triton-repo, coverage; `sweep`; `serve`), the error contract every command ends through
(`contract`: one exception -> exit code mapping, the shared input checks) and the ONNX Runtime distribution check
(`ort_dist`).

Console entry point `raggedvit` = `raggedvit.cli:main`; `python -m raggedvit` runs the same group.
"""

from __future__ import annotations

from raggedvit.cli.app import main
from raggedvit.cli.contract import CliError
from raggedvit.cli.serve import serve
from raggedvit.cli.sweep import sweep
from raggedvit.cli.tools import bench, coverage, triton_repo

__all__ = ["CliError", "main"]

for _command in (bench, triton_repo, coverage, sweep, serve):
    main.add_command(_command)
