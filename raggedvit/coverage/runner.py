"""The coverage runner: which timm ViT-like models PrunedViT runs, exports and matches.

A model is *ViT-like* when timm builds it on the meta device (`timm.create_model(name, pretrained=False)` under
`torch.device("meta")`) with attributes `blocks` and `patch_embed`. Each is checked at a reduced depth with
seeded random weights (raggedvit.coverage.model) in a child process of its own, with a timeout, `jobs` at a time:

report = run_coverage("deit_*", depth=2, img_size=224, jobs=4)
report.write_markdown("docs/coverage.md"); report.write_json("coverage.json")

A long sweep runs in shards (the convention of CI matrices: shard K of N checks every N-th model from the K-th,
K = 1..N) whose JSON reports `merge_reports` joins into one, in the unsharded order:

parts = [run_coverage(shard=(k, 4)) for k in (1, 2, 3, 4)]  # e.g. one per CI job
merge_reports(parts).write_markdown("docs/coverage.md")
"""

from __future__ import annotations

import datetime
import fnmatch
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raggedvit.coverage.model import MATCH_RTOL
from raggedvit.coverage.report import CoverageReport

__all__ = ["eta_seconds", "list_vit_like", "matching_names", "run_coverage"]

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding the raggedvit package
_CLASSIFY_CHUNK = 24  # names per meta-device listing child
_POLL_S = 0.1

Model = str | tuple[str, dict[str, Any]]
Progress = Callable[[int, int, dict[str, Any], float], None]  # (done, total, record, seconds since the checks began)


def eta_seconds(done: int, total: int, elapsed_s: float) -> float:
    """Seconds left at the mean pace so far: elapsed_s / done per model for the total - done models left."""
    return elapsed_s / done * (total - done) if done else float("nan")


def _cpu_count() -> int:
    """CPUs this process may run on (the affinity mask, not the host's count, where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _split_globs(pattern: str) -> list[str]:
    return [p.strip() for p in pattern.split(",") if p.strip()] or ["*"]


def _child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_PACKAGE_ROOT), env.get("PYTHONPATH")) if p)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    env.setdefault("PYTHONWARNINGS", "ignore")
    return env


@dataclass
class _Task:
    key: Any
    mode: str  # "classify" | "check"
    args: Any
    timeout_s: float
    out: Path = field(init=False)
    wall_s: float = field(init=False, default=0.0)


def _run_children(
    tasks: Sequence[_Task], *, jobs: int, threads: int, workdir: Path, on_done: Callable[[_Task, str | None], list]
) -> None:
    """Run every task as `python -m raggedvit.coverage.model MODE ARGS OUT`, `jobs` at a time. on_done(task,
    failure) gets failure None on exit 0, else why the child stopped ("timeout after 120 s", "exit code -11
    (SIGSEGV): <last stderr line>"), and returns further tasks to queue."""
    pending: deque[_Task] = deque(tasks)
    running: dict[int, tuple[_Task, subprocess.Popen, float, Path]] = {}
    env = _child_env(threads)
    serial = 0
    try:
        while pending or running:
            while pending and len(running) < jobs:
                task = pending.popleft()
                serial += 1
                task.out = workdir / f"{serial}.json"
                err = workdir / f"{serial}.stderr"
                with open(err, "w") as err_f:
                    proc = subprocess.Popen(
                        [sys.executable, "-m", "raggedvit.coverage.model", task.mode, json.dumps(task.args), task.out],
                        stdin=subprocess.DEVNULL,
                        stdout=err_f,
                        stderr=subprocess.STDOUT,
                        env=env,
                        start_new_session=True,  # its own process group: a timeout kills what it started too
                    )
                running[proc.pid] = (task, proc, time.monotonic(), err)
            time.sleep(_POLL_S)
            for pid, (task, proc, t0, err) in list(running.items()):
                rc = proc.poll()
                failure = None
                if rc is None:
                    if time.monotonic() - t0 <= task.timeout_s:
                        continue
                    _kill(proc)
                    failure = f"timeout after {task.timeout_s:g} s"
                elif rc != 0:
                    failure = f"exit code {rc}{_signal_name(rc)}: {_last_line(err)}"
                del running[pid]
                task.wall_s = time.monotonic() - t0
                pending.extend(on_done(task, failure))
    finally:
        for _, proc, _, _ in running.values():
            _kill(proc)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _signal_name(rc: int) -> str:
    if rc >= 0:
        return ""
    try:
        return f" ({signal.Signals(-rc).name})"
    except ValueError:
        return ""


def _last_line(path: Path) -> str:
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:500] if lines else "(no output)"


def _read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by a kill
            break
    return rows


def matching_names(pattern: str = "*") -> list[str]:
    """The names in timm.list_models() that match `pattern` (comma-separated fnmatch globs)."""
    import timm

    globs = _split_globs(pattern)
    return [n for n in timm.list_models() if any(fnmatch.fnmatchcase(n, g) for g in globs)]


def list_vit_like(
    names: Sequence[str], *, jobs: int = 1, timeout_s: float = 120.0
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(ViT-like models, names timm could not build) among `names`. Rows: {"name", "family" (the timm module of
    the model's class), "cls"}, or {"name", "error"}. Built on the meta device in child processes, `jobs` at a
    time; a child that crashes or hangs costs the name it was building, retried alone first."""
    names = list(names)
    if not names:
        return [], []
    rows: dict[str, dict[str, Any]] = {}
    size = max(1, min(_CLASSIFY_CHUNK, math.ceil(len(names) / jobs)))

    def on_done(task: _Task, failure: str | None) -> list[_Task]:
        for row in _read_lines(task.out):
            rows[row["name"]] = row
        missing = [n for n in task.args if n not in rows]
        if not missing:
            return []
        if len(task.args) == 1:  # alone, it still failed: that name is the cause
            rows[missing[0]] = {"name": missing[0], "vit_like": None, "error": f"meta device build: {failure}"}
            return []
        # the first missing name stopped the child: retry it alone, and the rest as a new chunk
        retry = [_Task(missing[0], "classify", missing[:1], timeout_s)]
        return retry + ([_Task(missing[1], "classify", missing[1:], timeout_s)] if missing[1:] else [])

    tasks = [_Task(names[i], "classify", names[i : i + size], timeout_s) for i in range(0, len(names), size)]
    with tempfile.TemporaryDirectory(prefix="raggedvit-coverage-") as tmp:
        _run_children(tasks, jobs=jobs, threads=1, workdir=Path(tmp), on_done=on_done)
    ordered = [rows[n] for n in names]
    vit_like = [{k: r[k] for k in ("name", "family", "cls")} for r in ordered if r.get("vit_like")]
    failed = [{"name": r["name"], "error": r["error"]} for r in ordered if "error" in r]
    return vit_like, failed


def _failed_column(stage: str) -> str:
    if stage.startswith(("export", "ort load")):
        return "exports"
    if stage.startswith(("ort run", "timm forward")):
        return "matches"
    return "runs"


def _label(model: Model) -> tuple[str, dict[str, Any]]:
    return (model, {}) if isinstance(model, str) else (model[0], dict(model[1]))


def run_coverage(
    pattern: str = "*",
    *,
    models: Sequence[Model] | None = None,
    depth: int = 2,
    img_size: int = 224,
    jobs: int = 1,
    timeout_s: float = 120.0,
    seed: int = 0,
    shard: tuple[int, int] | None = None,
    progress: Progress | None = None,
) -> CoverageReport:
    """Check every ViT-like timm model matching `pattern` (or exactly `models`: names or (name, create_model
    kwargs) pairs, not listed first) in its own child process: columns runs / exports / matches.

    Each model keeps its first `depth` blocks (the pruning stage is at block 1), its default image size unless
    a side exceeds `img_size` and timm accepts a smaller img_size, and seeded weights. A child past `timeout_s`
    is killed; the column it was in fails with the timeout. shard (K, N): only every N-th model from the K-th
    (1-based) of that list. progress(done, total, record, seconds since the checks began) after each model."""
    if depth < 2:
        raise ValueError(f"depth must be >= 2 (the pruning stage is at block 1), got {depth}")
    if jobs < 1 or img_size < 1 or timeout_s <= 0:
        raise ValueError(f"jobs, img_size and timeout_s must be positive, got {jobs}, {img_size}, {timeout_s}")
    if shard is not None and not 1 <= shard[0] <= shard[1]:
        raise ValueError(f"shard must be (K, N) with 1 <= K <= N, got {shard}")
    start = time.perf_counter()
    not_built: list[dict[str, Any]] = []
    names_listed = None
    if models is None:
        names = matching_names(pattern)
        names_listed = len(names)
        listed, not_built = list_vit_like(names, jobs=jobs, timeout_s=timeout_s)
        entries = [(row["name"], {}) for row in listed]
        families = {row["name"]: row["family"] for row in listed}
    else:
        entries, families = [_label(m) for m in models], {}
    if shard is not None:
        entries = entries[shard[0] - 1 :: shard[1]]
    listing_s = time.perf_counter() - start
    threads = max(1, _cpu_count() // jobs)
    records: dict[int, dict[str, Any]] = {}

    def on_done(task: _Task, failure: str | None) -> list[_Task]:
        name, kwargs = entries[task.key]
        found = json.loads(task.out.read_text()) if task.out.exists() else {"stage": "start"}
        rec = {"name": name, "kwargs": kwargs, "runs": None, "exports": None, "matches": None, **found}
        rec.setdefault("family", families.get(name))
        stage = rec.pop("stage", None)
        if stage is not None:  # the child stopped before its record was complete
            column = _failed_column(stage)
            rec[column] = False
            rec[f"{column}_error"] = f"{stage}: {failure or 'the child exited without finishing its record'}"
        elif failure is not None:  # complete, then a failing exit (interpreter teardown): the columns stand
            rec["exit_note"] = failure
        rec["wall_s"] = round(task.wall_s, 1)
        records[task.key] = rec
        if progress is not None:
            progress(len(records), len(entries), rec, time.perf_counter() - start - listing_s)
        return []

    args = {"depth": depth, "img_size": img_size, "seed": seed, "threads": threads}
    tasks = [_Task(i, "check", {"name": n, "kwargs": kw, **args}, timeout_s) for i, (n, kw) in enumerate(entries)]
    with tempfile.TemporaryDirectory(prefix="raggedvit-coverage-") as tmp:
        _run_children(tasks, jobs=jobs, threads=threads, workdir=Path(tmp), on_done=on_done)
    meta = _meta(pattern if models is None else None, depth, img_size, timeout_s, seed, jobs)
    meta.update(names_listed=names_listed, listing_s=round(listing_s, 1), wall_s=round(time.perf_counter() - start, 1))
    if shard is not None:
        meta["shard"] = f"{shard[0]}/{shard[1]}"
    return CoverageReport(meta, [records[i] for i in range(len(entries))], not_built)


def _meta(pattern: str | None, depth: int, img_size: int, timeout_s: float, seed: int, jobs: int) -> dict[str, Any]:
    import onnxruntime
    import timm
    import torch

    import raggedvit

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "timm": timm.__version__,
        "torch": torch.__version__,
        "onnxruntime": onnxruntime.__version__,
        "raggedvit": raggedvit.__version__,
        "filter": pattern,
        "depth": depth,
        "img_size_cap": img_size,
        "timeout_s": timeout_s,
        "seed": seed,
        "jobs": jobs,
        "match_rtol": MATCH_RTOL,
    }
