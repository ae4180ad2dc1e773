"""Seeded, time-boxed CPU-EP fuzz of the op library's CPU kernels, each batch of calls in a child process.

    summary = run_fuzz(seed=14, calls=10_000)      # or: python3 scripts/fuzz_ort_cpu.py --seed 14

A child (`python3 -m fuzz.driver --worker ...`) runs the cases [first, first + count) of `fuzz.linear.draw_any(seed, i)`
(every fifth call a RaggedLinear case, then RaggedSelect, BiasGelu, GatherLayerNorm, PatchEmbed, RaggedMerge and
RaggedAttention ones by i % 10 and i % 20) and announces each call on stdout before making it, so a crash (a signal, an
abort) or a hang is pinned to one call: it is reported with the seed, the call index, the case and a replay command, and
the batch resumes after that call in a fresh child. pytest never runs the op in its own process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["FuzzSummary", "run_fuzz"]

_MODULE = "fuzz.driver"  # what a child runs: python3 -m _MODULE --worker SEED FIRST COUNT
FUZZ_PARENT = Path(__file__).resolve().parents[1]  # tests/custom_ops: the children import this package from it
PACKAGE_PARENT = Path(__file__).resolve().parents[3]  # the checkout holding raggedvit: the children import it
MAX_RESTARTS = 5  # crashes tolerated per batch before the rest of it is skipped


@dataclass
class FuzzSummary:
    """Counts over all batches: outcomes (checked / rejected_session / rejected_run / failed), categories of the
    expected error ("valid" for valid cases), and the failures and crashes as one-line reports."""

    seed: int
    requested: int
    calls: int = 0
    outcomes: Counter = field(default_factory=Counter)
    categories: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    crashes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    timed_out: bool = False
    abandoned: int = 0  # batches given up after MAX_RESTARTS crashes

    @property
    def ok(self) -> bool:
        return not self.failures and not self.crashes and not self.timed_out and self.calls >= self.requested

    def line(self) -> str:
        o = self.outcomes
        return (
            f"CPU-EP fuzz (seed {self.seed}): {self.calls} calls in {self.seconds:.1f} s, {len(self.crashes)} crashes, "
            f"{len(self.failures)} failures; {o['checked']} valid calls matched the reference, "
            f"{o['rejected_session']} invalid nodes refused at session creation, {o['rejected_run']} invalid inputs "
            f"refused at run time"
            + (" (time budget exhausted)" if self.timed_out else "")
            + (f" ({self.abandoned} batches abandoned after {MAX_RESTARTS} crashes)" if self.abandoned else "")
        )

    def report(self) -> str:
        cats = ", ".join(f"{k} {v}" for k, v in sorted(self.categories.items()))
        lines = [self.line(), f"  cases by expected error: {cats}"]
        lines += [f"  CRASH {c}" for c in self.crashes[:10]] + [f"  FAIL {f}" for f in self.failures[:10]]
        return "\n".join(lines)


def _replay(seed: int, index: int) -> str:
    return f"python3 scripts/fuzz_ort_cpu.py --seed {seed} --first {index} --calls 1"


def _describe(seed: int, index: int) -> str:
    from fuzz.linear import draw_any, expected_any

    case = draw_any(seed, index)
    return f"{case.describe()}; expected: {expected_any(case) or 'valid'}"


def _run_batch(
    seed: int, first: int, count: int, deadline: float, timeout_s: float, summary: FuzzSummary, lock
) -> None:
    path = [str(FUZZ_PARENT), str(PACKAGE_PARENT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    restarts, end = 0, first + count
    while first < end and restarts <= MAX_RESTARTS:
        if time.monotonic() > deadline:
            with lock:
                summary.timed_out = True
            return
        cmd = [sys.executable, "-m", _MODULE, "--worker", str(seed), str(first), str(end - first)]
        hung = False
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
            out, err, rc = res.stdout, res.stderr, res.returncode
        except subprocess.TimeoutExpired as e:
            out, err, rc, hung = _text(e.stdout), _text(e.stderr), None, True
        started = finished = None
        with lock:
            for line in out.splitlines():
                tag, _, rest = line.partition(" ")
                if tag == "S":
                    started = int(rest)
                elif tag == "R":
                    index, outcome, category = rest.split(" ", 2)
                    finished = int(index)
                    summary.calls += 1
                    summary.outcomes[outcome] += 1
                    summary.categories[category] += 1
                elif tag == "F":
                    summary.failures.append(rest)
            if rc == 0 and finished == end - 1:
                return
            how = "hung" if hung else _exit_text(rc)
            tail = " | ".join(err.strip().splitlines()[-3:])
            if started is None or started == finished:  # not inside a call: start-up or exit
                summary.crashes.append(
                    f"a child of batch {first}..{end - 1} (seed {seed}) {how} outside a call: {tail!r}"
                )
                return
            summary.crashes.append(
                f"call {started} (seed {seed}) {how}: {_describe(seed, started)}; stderr: {tail!r}; "
                f"replay: {_replay(seed, started)}"
            )
        first, restarts = started + 1, restarts + 1  # resume after the crashing call
    if first < end:
        with lock:
            summary.abandoned += 1


def _exit_text(rc: int) -> str:
    if rc >= 0:
        return f"exited with {rc}"
    try:
        return f"died of {signal.Signals(-rc).name}"
    except ValueError:
        return f"died of signal {-rc}"


def _text(data: bytes | str | None) -> str:
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return data or ""


def run_fuzz(
    seed: int,
    calls: int = 10_000,
    *,
    first: int = 0,
    batch: int = 2_500,
    jobs: int = 2,
    budget_s: float = 150.0,
    batch_timeout_s: float = 120.0,
) -> FuzzSummary:
    """Runs calls [first, first + calls) of fuzz run `seed` in child processes of `batch` calls, `jobs` at a time.

    Batches not started within budget_s are skipped (summary.timed_out); a child running past batch_timeout_s
    counts as a hang at the call it announced last."""
    summary = FuzzSummary(seed=seed, requested=calls)
    lock = threading.Lock()
    t0 = time.monotonic()
    deadline = t0 + budget_s
    end = first + calls
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [
            pool.submit(_run_batch, seed, start, min(batch, end - start), deadline, batch_timeout_s, summary, lock)
            for start in range(first, end, batch)
        ]
        for f in futures:
            f.result()
    summary.seconds = time.monotonic() - t0
    return summary


def _worker(seed: int, first: int, count: int) -> None:
    """Child: runs the cases; prints "S i" before call i, "F <report>" if it failed, "R i <outcome> <category>"."""
    import torch

    from fuzz.linear import draw_any, expected_any, run_any

    torch.set_num_threads(1)
    sessions: dict = {}
    kill_at = int(os.environ.get("RAGGEDVIT_FUZZ_KILL_AT", -1))  # tests of the crash reporting
    for i in range(first, first + count):
        print(f"S {i}", flush=True)
        if i == kill_at:
            os.kill(os.getpid(), signal.SIGSEGV)
        case = draw_any(seed, i)
        outcome, error = run_any(case, sessions)
        expected = expected_any(case)
        if error is not None:
            msg = " ".join(error.split())[:600]
            print(f"F call {i} (seed {seed}): {msg}; case: {case.describe()}; replay: {_replay(seed, i)}")
        print(f"R {i} {outcome} {expected.split(':')[0] if expected else 'valid'}", flush=True)
        if len(sessions) > 512:  # bounded memory over long batches
            sessions.clear()


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        _worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    else:
        sys.exit(f"usage: python3 -m {_MODULE} --worker SEED FIRST COUNT (see scripts/fuzz_ort_cpu.py)")
