"""The GPU suite's record: a pytest JUnit XML of `pytest -m gpu tests` -> benchmarks/results/gpu_tests_<GPU>.json.

    python3 -m pytest -m gpu tests --junitxml=gpu_tests.xml
    python3 -m benchmarks.gpu_tests gpu_tests.xml [--out benchmarks/results] [--gpu NAME]

The record holds the commit, the GPU, the package versions (benchmarks.env), the counts of passed, failed, errored
and skipped tests and the ids of the failing ones (pytest node ids). The GPU is the first CUDA device's name, or
`--gpu` where the XML is converted on another machine. The README's test section shows the newest record
(benchmarks.readme_results); a CPU test (tests/benchmarks/test_gpu_tests.py) checks each committed record with
`problems`, which does not look at the commit's age.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from benchmarks.env import environment, result_path

__all__ = ["COUNTS", "problems", "read_junit", "record"]

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
    if counts["failed"] or counts["errors"]:
        bad = [*(suite.get("failing") or []), *(suite.get("erroring") or [])]
        out.append(f"{counts['failed']} failed and {counts['errors']} errored: {', '.join(bad[:10])}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("junit", type=Path, help="the JUnit XML of `python3 -m pytest -m gpu tests --junitxml=...`")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--gpu", default=None, help="the GPU's name (default: the first CUDA device's)")
    args = ap.parse_args(argv)
    data = record(args.junit, args.gpu)
    path = result_path(args.out, "gpu_tests", data["gpu"])
    path.write_text(json.dumps(data, indent=1) + "\n")
    s = data["suite"]
    print(f"wrote {path}: {s['passed']} passed, {s['failed']} failed, {s['errors']} errors, {s['skipped']} skipped")
    for node in [*s["failing"], *s["erroring"]]:
        print(f"  failing: {node}")
    return 0 if not problems(data) else 1


if __name__ == "__main__":
    sys.exit(main())
