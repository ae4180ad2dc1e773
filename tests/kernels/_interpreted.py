"""Runs one of this folder's `_*_cases.py` scripts in a process started with TRITON_INTERPRET=1 (the kernels need
it set before triton's import) and returns the JSON it prints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.env import child_env

_HERE = Path(__file__).resolve().parent


def run_cases_interpreted(script: str, *args: str) -> Any:
    """The parsed stdout of `python3 tests/kernels/<script> [args]` under TRITON_INTERPRET=1 (asserts exit status
    0)."""
    env = child_env(TRITON_INTERPRET="1")
    cmd = [sys.executable, str(_HERE / script), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout)
