"""The GPU suite: run it in chunks that fit a call, and keep its record -> benchmarks/results/gpu_tests_<GPU>.json.

    python3 -m benchmarks.gpu_tests run --out DIR [--budget-s 540] [--chunk K/N] [--workers 16]
    python3 -m benchmarks.gpu_tests merge DIR [DIR ...] [--out benchmarks/results] [--gpu NAME]
    python3 -m benchmarks.gpu_tests junit gpu_tests.xml [--out benchmarks/results] [--gpu NAME]

`run` collects `pytest -m gpu tests`, splits the tests into N chunks balanced by the durations of the newest record
(longest first onto the lightest chunk; a test without a recorded duration counts as the median), and runs chunk K
(every chunk, one after the other, without --chunk) under pytest-xdist. Each chunk writes its JUnit XML
(chunk-K-of-N.xml) when it ends, a JSON line per test phase as the phase ends (chunk-K-of-N.jsonl, through
benchmarks._pytest_log) and its own summary (chunk-K-of-N.json: the ids it holds, its status, seconds, commit and
environment). A chunk still running when the budget is spent gets SIGINT, then SIGKILL 30 s later: what finished is
kept, and the summary says `cut`.

`merge` makes the one record from the chunk folders of one commit: counts, failing and erroring ids, the duration of
every test (the next `run` balances by them), each chunk's status, and the tests that never finished. `junit`
converts a plain pytest JUnit XML, as before the chunks existed.

The README's test section shows the newest record (benchmarks.readme_results); `problems` says what is wrong with
one (a failure, an error, a chunk missing or cut, a test that did not run), without looking at the commit's age.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from benchmarks.env import environment, result_path

__all__ = [
    "COUNTS",
    "collect",
    "merge",
    "partition",
    "problems",
    "read_chunk",
    "read_junit",
    "record",
    "recorded_durations",
    "run_chunk",
]

ROOT = Path(__file__).resolve().parent.parent
COUNTS = ("passed", "failed", "errors", "skipped")


def _node_id(classname: str, name: str, root: Path) -> str:
    """pytest's node id of a JUnit test case: the longest dotted prefix of classname that is a test file under
    `root` becomes its path, the rest its classes ('tests.a.test_b.TestC' -> 'tests/a/test_b.py::TestC::name')."""
    parts = classname.split(".") if classname else []
    for cut in range(len(parts), 0, -1):
        path = Path(*parts[:cut]).with_suffix(".py")
        if (root / path).is_file():
            return "::".join([path.as_posix(), *parts[cut:], name])
    return "::".join([p for p in (classname, name) if p])


def read_junit(path: str | Path, root: Path = ROOT) -> dict[str, Any]:
    """The outcome of every test case of a pytest JUnit XML: counts (COUNTS, tests) and the failing and errored
    node ids, the suite's time and timestamp."""
    tree = ET.parse(str(path)).getroot()
    suites = [tree] if tree.tag == "testsuite" else tree.findall("testsuite")
    counts = dict.fromkeys(COUNTS, 0)
    failing, erroring = [], []
    seconds, stamp = 0.0, None
    for suite in suites:
        seconds += float(suite.get("time") or 0.0)
        stamp = stamp or suite.get("timestamp")
        for case in suite.iter("testcase"):
            node = _node_id(case.get("classname", ""), case.get("name", ""), root)
            if case.find("failure") is not None:
                counts["failed"] += 1
                failing.append(node)
            elif case.find("error") is not None:
                counts["errors"] += 1
                erroring.append(node)
            elif case.find("skipped") is not None:
                counts["skipped"] += 1
            else:
                counts["passed"] += 1
    return {
        **counts,
        "tests": sum(counts.values()),
        "failing": failing,
        "erroring": erroring,
        "seconds": round(seconds, 1),
        "timestamp": stamp,
    }


def record(junit: str | Path, gpu: str | None = None, root: Path = ROOT) -> dict[str, Any]:
    """The record of one GPU suite run: {benchmark, gpu, commit, env, suite: read_junit(junit)}. `gpu`: the GPU's
    name (default: the first CUDA device's, from benchmarks.env); ValueError when there is none."""
    env = environment()
    name = gpu or (env.get("gpu") or {}).get("name")
    if not name:
        raise ValueError("no CUDA device here: name the GPU the suite ran on with --gpu")
    return {
        "benchmark": "gpu_tests",
        "command": "python3 -m pytest -m gpu tests",
        "gpu": name,
        "commit": env.get("commit"),
        "env": env,
        "suite": read_junit(junit, root),
    }


def problems(data: dict[str, Any]) -> list[str]:
    """What is wrong with a record, [] when it is well formed and its run had no failing test: the GPU and a
    commit named, package versions, counts that add up, as many failing / erroring ids as failures / errors, at
    least one test passed and none failed or errored. The commit's age is not checked."""
    out = []
    if data.get("benchmark") != "gpu_tests":
        out.append(f"benchmark is {data.get('benchmark')!r}, not 'gpu_tests'")
    gpu = data.get("gpu")
    if not isinstance(gpu, str) or not gpu or gpu.lower() == "cpu":
        out.append(f"no GPU named ({gpu!r})")
    if not isinstance(data.get("commit"), str) or not re.fullmatch(r"[0-9a-f]{7,40}", data["commit"]):
        out.append(f"no commit ({data.get('commit')!r})")
    packages = (data.get("env") or {}).get("packages") or {}
    if not packages.get("torch") or not (packages.get("onnxruntime-gpu") or packages.get("onnxruntime")):
        out.append("the torch and onnxruntime versions are missing")
    suite = data.get("suite")
    if not isinstance(suite, dict):
        return [*out, "no suite"]
    counts = {k: suite.get(k) for k in (*COUNTS, "tests")}
    if not all(isinstance(v, int) and v >= 0 for v in counts.values()):
        return [*out, f"counts are not non-negative integers: {counts}"]
    if sum(counts[k] for k in COUNTS) != counts["tests"]:
        out.append(f"passed + failed + errors + skipped != tests: {counts}")
    if len(suite.get("failing") or []) != counts["failed"] or len(suite.get("erroring") or []) != counts["errors"]:
        out.append("the failing / erroring ids do not match the counts")
    if counts["passed"] == 0:
        out.append("no test passed")
    chunks = data.get("chunks")
    if chunks is not None:
        total = {c.get("of") for c in chunks}
        present = sorted(c.get("chunk") for c in chunks)
        if len(total) != 1 or present != list(range(1, (total.pop() or 0) + 1)):
            out.append(f"chunks missing: have {present} of {sorted({c.get('of') for c in chunks})}")
        cut = [f"{c['chunk']}/{c['of']}" for c in chunks if c.get("status") != "complete"]
        if cut:
            out.append(f"chunks not complete: {', '.join(cut)}")
        if suite.get("not_run"):
            out.append(f"{len(suite['not_run'])} tests did not finish: {', '.join(suite['not_run'][:5])}")
    if counts["failed"] or counts["errors"]:
        bad = [*(suite.get("failing") or []), *(suite.get("erroring") or [])]
        out.append(f"{counts['failed']} failed and {counts['errors']} errored: {', '.join(bad[:10])}")
    return out


_GROUP_SUFFIX = re.compile(r"@[\w.-]+$")  # pytest-xdist --dist loadgroup appends @<group> to a grouped test's id
_GRACE_S = 30.0  # after SIGINT, pytest's time to write its JUnit XML before SIGKILL


def collect(pytest_args: list[str] | None = None, root: Path = ROOT) -> list[str]:
    """The node ids of `pytest -m gpu tests` (extra `pytest_args` narrow it), in collection order."""
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "--collect-only", "-q", "-p", "no:randomly"]
    res = subprocess.run([*cmd, *(pytest_args or ["tests"])], cwd=root, capture_output=True, text=True, timeout=600)
    ids = [line.strip() for line in res.stdout.splitlines() if "::" in line and not line.startswith(" ")]
    if res.returncode not in (0, 5) or (res.returncode == 0 and not ids):
        tail = res.stdout[-3000:] + res.stderr[-3000:]
        raise RuntimeError(f"collecting the GPU tests failed (exit {res.returncode}):\n{tail}")
    return ids


def recorded_durations(results: Path = ROOT / "benchmarks" / "results") -> dict[str, float]:
    """{node id: seconds} of the newest gpu_tests_<GPU>.json that has durations ({} when none has)."""
    best: tuple[str, dict[str, float]] = ("", {})
    for path in results.glob("gpu_tests_*.json"):
        data = json.loads(path.read_text())
        durations = (data.get("suite") or {}).get("durations") or {}
        date = str((data.get("env") or {}).get("date"))
        if durations and date > best[0]:
            best = (date, durations)
    return best[1]


def partition(ids: list[str], durations: dict[str, float], n: int) -> list[list[str]]:
    """`ids` in n chunks of about equal recorded time: longest first onto the lightest chunk (ties: the lower
    chunk), a test with no recorded duration counted as the median of those recorded (1 s when none is). Each chunk
    keeps the collection order."""
    if n < 1:
        raise ValueError(f"the number of chunks must be at least 1, got {n}")
    known = [durations[i] for i in ids if i in durations]
    default = statistics.median(known) if known else 1.0
    cost = {i: durations.get(i, default) for i in ids}
    loads, members = [0.0] * n, [set() for _ in range(n)]
    for i in sorted(ids, key=lambda i: -cost[i]):  # stable: equal costs keep the collection order
        k = min(range(n), key=lambda k: (loads[k], k))
        loads[k] += cost[i]
        members[k].add(i)
    return [[i for i in ids if i in m] for m in members]


def _outcomes(lines: list[dict[str, Any]]) -> dict[str, tuple[str, float]]:
    """{node id: (outcome, seconds)} from a chunk's phase reports: 'failed' (the call failed), 'error' (setup or
    teardown failed), 'skipped', 'passed', or 'unfinished' (a setup with no call report: the chunk was cut)."""
    phases: dict[str, dict[str, str]] = {}
    seconds: dict[str, float] = {}
    for line in lines:
        node = line["nodeid"]
        phases.setdefault(node, {})[line["when"]] = line["outcome"]
        seconds[node] = seconds.get(node, 0.0) + float(line.get("duration") or 0.0)
    out = {}
    for node, ph in phases.items():
        if ph.get("call") == "failed":
            outcome = "failed"
        elif "failed" in (ph.get("setup"), ph.get("teardown")):
            outcome = "error"
        elif "skipped" in (ph.get("setup"), ph.get("call")):
            outcome = "skipped"
        elif ph.get("call") == "passed" and "teardown" in ph:
            outcome = "passed"
        else:
            outcome = "unfinished"
        out[node] = (outcome, round(seconds[node], 3))
    return out


def _chunk_name(k: int, n: int) -> str:
    return f"chunk-{k}-of-{n}"


def run_chunk(
    ids: list[str], out: Path, k: int, n: int, budget_s: float, workers: int, root: Path = ROOT
) -> dict[str, Any]:
    """Runs chunk k of n (its node `ids`) under pytest-xdist with `workers` processes, for at most `budget_s`
    seconds, and writes chunk-K-of-N.{xml,jsonl,json} into `out`. Returns the summary written to the .json:
    {chunk, of, ids, status ('complete' or 'cut'), returncode, seconds, commit, env}."""
    out.mkdir(parents=True, exist_ok=True)
    name = _chunk_name(k, n)
    log = out / f"{name}.jsonl"
    log.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-p", "benchmarks._pytest_log", f"--junitxml={out / name}.xml"]
    cmd += [f"-n{workers}"] if workers > 1 else []
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}  # a run of its own
    env |= {"RAGGEDVIT_TEST_LOG": str(log.resolve()), "PYTHONUNBUFFERED": "1"}
    start = time.monotonic()
    status = "complete"
    with subprocess.Popen([*cmd, *ids], cwd=root, env=env, start_new_session=True) as proc:
        try:
            proc.wait(timeout=max(1.0, budget_s))
        except subprocess.TimeoutExpired:
            status = "cut"
            print(f"{name}: the budget of {budget_s:.0f} s is spent: SIGINT", flush=True)
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    env_record = environment()
    summary = {
        "chunk": k,
        "of": n,
        "ids": ids,
        "status": status,
        "returncode": proc.returncode,
        "seconds": round(time.monotonic() - start, 1),
        "commit": env_record.get("commit"),
        "env": env_record,
    }
    (out / f"{name}.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def read_chunk(summary_path: Path) -> tuple[dict[str, Any], dict[str, tuple[str, float]]]:
    """A chunk's summary and {node id: (outcome, seconds)} for each of its ids: from its JSON lines, a chunk id
    with no finished report is 'unfinished'."""
    summary = json.loads(summary_path.read_text())
    log = summary_path.with_suffix(".jsonl")
    lines = [json.loads(x) for x in log.read_text().splitlines() if x.strip()] if log.exists() else []
    reported = {_GROUP_SUFFIX.sub("", node): res for node, res in _outcomes(lines).items()}
    return summary, {i: reported.get(i, ("unfinished", 0.0)) for i in summary["ids"]}


def merge(dirs: list[Path], gpu: str | None = None) -> dict[str, Any]:
    """The one record of the chunk folders `dirs` (see the module's doc). ValueError when they hold no chunk, mix
    commits or chunkings, or hold one chunk twice."""
    paths = sorted(p for d in dirs for p in Path(d).glob("chunk-*-of-*.json"))
    if not paths:
        raise ValueError(f"no chunk-K-of-N.json in {', '.join(map(str, dirs))}")
    chunks, tests = [], {}
    for path in paths:
        summary, outcomes = read_chunk(path)
        if any(c["chunk"] == summary["chunk"] for c in chunks):
            raise ValueError(f"chunk {summary['chunk']} appears twice ({path})")
        chunks.append(summary)
        tests.update(outcomes)
    for key in ("commit", "of"):
        if len({c[key] for c in chunks}) != 1:
            raise ValueError(f"the chunks differ in {key}: {sorted({str(c[key]) for c in chunks})}")
    env = chunks[0]["env"]
    name = gpu or (env.get("gpu") or {}).get("name")
    if not name:
        raise ValueError("the chunks name no GPU: name the GPU the suite ran on with --gpu")
    by = {o: sorted(i for i, (outcome, _) in tests.items() if outcome == o) for o in
          ("passed", "failed", "error", "skipped", "unfinished")}  # fmt: skip
    suite = {
        "passed": len(by["passed"]),
        "failed": len(by["failed"]),
        "errors": len(by["error"]),
        "skipped": len(by["skipped"]),
        "tests": len(tests) - len(by["unfinished"]),
        "failing": by["failed"],
        "erroring": by["error"],
        "not_run": by["unfinished"],
        "seconds": round(sum(c["seconds"] for c in chunks), 1),
        "timestamp": env.get("date"),
        "durations": {i: s for i, (outcome, s) in sorted(tests.items()) if outcome != "unfinished"},
    }
    n = chunks[0]["of"]
    return {
        "benchmark": "gpu_tests",
        "command": f"python3 -m benchmarks.gpu_tests run (pytest -m gpu tests in {n} chunk{'s' * (n > 1)})",
        "gpu": name,
        "commit": chunks[0]["commit"],
        "env": env,
        "chunks": [
            {k: c[k] for k in ("chunk", "of", "status", "returncode", "seconds")} | {"tests": len(c["ids"])}
            for c in sorted(chunks, key=lambda c: c["chunk"])
        ],  # fmt: skip
        "suite": suite,
    }


def _write(data: dict[str, Any], out: Path) -> int:
    path = result_path(out, "gpu_tests", data["gpu"])
    path.write_text(json.dumps(data, indent=1) + "\n")
    s = data["suite"]
    print(f"wrote {path}: {s['passed']} passed, {s['failed']} failed, {s['errors']} errors, {s['skipped']} skipped")
    for line in problems(data):
        print(f"  problem: {line}")
    return 0 if not problems(data) else 1


def _run(args: argparse.Namespace) -> int:
    k, n = (int(x) for x in args.chunk.split("/")) if re.fullmatch(r"\d+/\d+", args.chunk) else (0, 0)
    if not 1 <= k <= n:
        raise SystemExit(f"--chunk is K/N with 1 <= K <= N, got {args.chunk!r}")
    deadline = time.monotonic() + args.budget_s
    ids = collect(args.pytest_args)
    chunks = partition(ids, recorded_durations(), n)
    todo = [k] if args.chunk_given else list(range(1, n + 1))
    bad = 0
    for k in todo:
        left = deadline - time.monotonic()
        s = run_chunk(chunks[k - 1], args.out, k, n, left, args.workers)
        _, outcomes = read_chunk(args.out / f"{_chunk_name(k, n)}.json")
        counts = {o: sum(1 for r, _ in outcomes.values() if r == o) for o in
                  ("passed", "failed", "error", "skipped", "unfinished")}  # fmt: skip
        print(f"chunk {k}/{n}: {s['status']} in {s['seconds']} s: {counts}", flush=True)
        bad += counts["failed"] + counts["error"] + counts["unfinished"]
    return 0 if not bad else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the GPU suite, or one chunk of it")
    r.add_argument("--out", type=Path, required=True, help="the folder of the chunks' files")
    r.add_argument("--budget-s", type=float, default=540.0, help="seconds for all the chunks this call runs")
    r.add_argument("--chunk", default=None, help="K/N: run chunk K of N (default: every chunk of 1/1)")
    r.add_argument("--workers", type=int, default=16, help="pytest-xdist processes (1: none)")
    r.add_argument("pytest_args", nargs="*", help="after --: paths or -k expressions that narrow the collection")
    m = sub.add_parser("merge", help="the record of the chunk folders of one run")
    m.add_argument("dirs", type=Path, nargs="+")
    j = sub.add_parser("junit", help="the record of a plain pytest JUnit XML")
    j.add_argument("junit", type=Path, help="the JUnit XML of `python3 -m pytest -m gpu tests --junitxml=...`")
    for p in (m, j):
        p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
        p.add_argument("--gpu", default=None, help="the GPU's name (default: the one the chunks or this machine has)")
    args = ap.parse_args(argv)
    if args.command == "run":
        args.chunk_given = args.chunk is not None
        args.chunk = args.chunk or "1/1"
        return _run(args)
    try:
        data = merge(args.dirs, args.gpu) if args.command == "merge" else record(args.junit, args.gpu)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return _write(data, args.out)


if __name__ == "__main__":
    sys.exit(main())
