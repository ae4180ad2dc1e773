"""`raggedvit serve` end to end on a seeded deit_tiny export (topk-l2), two replicas on a local Ray instance on a free
loopback port: answers checked against direct ONNX Runtime, bad bodies answered 4xx while it keeps serving, a replica
killed mid-load with no request lost or hanging, and SIGTERM leaving no process of it running. Refusals that need no
Ray (an op library that cannot load, a port in use) come first.

The tests run in file order on one worker (they share the server; the last one stops it); however they end, the
module fixture kills what is left of the server's process tree (benchmarks.serve_load.server.ServerProcess)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("ray.serve")

from benchmarks.serve_load.client import Body, run_load, summary  # noqa: E402
from benchmarks.serve_load.reference import check, direct_answers, request_bodies  # noqa: E402
from benchmarks.serve_load.server import ServerProcess, free_port  # noqa: E402
from tests.support.cli import run_cli  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MODEL = "deit_tiny_patch16_224"
READY_S = 300  # a loaded 2-core machine: Ray, Serve and two replicas importing torch
REQUEST_S = 120

pytestmark = [pytest.mark.xdist_group("serving_serve"), pytest.mark.slow]


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("serve") / "deit_tiny.onnx"
    res = run_cli("export", MODEL, "--seed", "0", "--policy", "topk-l2", "--prune-at", "4", "-o", str(out))
    assert res.returncode == 0, res.stderr
    return out


@pytest.fixture(scope="module")
def bodies() -> list[Body]:
    return request_bodies(16)


@pytest.fixture(scope="module")
def reference(exported, bodies):
    return direct_answers(exported, bodies)


@pytest.fixture(scope="module")
def server(exported) -> Iterator[ServerProcess]:
    with ServerProcess(exported, "--replicas", "2", "--max-batch-size", "8") as proc:
        proc.wait_ready(timeout_s=READY_S)
        yield proc


def _serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    environ.pop("RAGGEDVIT_DEBUG", None)
    cmd = [sys.executable, "-m", "raggedvit", "serve", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=environ, cwd=ROOT, timeout=300)


def _one_error_line(res) -> str:
    lines = res.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("error: "), res.stderr
    return lines[-1]


def test_unloadable_op_library_fails_at_start_naming_it(exported, tmp_path):
    bad = tmp_path / "libbroken.so"
    bad.write_text("not a shared library")
    res = _serve(str(exported), "--port", str(free_port()), env={"RAGGEDVIT_ORT_LIBRARY": str(bad)})
    assert res.returncode == 2, res.stderr
    line = _one_error_line(res)
    assert f"cannot load the raggedvit op library {bad}" in line, line
    assert "Ray" not in res.stderr  # refused before a Ray instance started


def test_port_in_use_and_missing_model_are_refused(exported, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = run_cli("serve", str(exported), "--port", str(port))
    assert res.returncode == 2 and f"port {port} on 127.0.0.1 is in use" in res.stderr, res.stderr
    res = run_cli("serve", str(tmp_path / "none.onnx"))
    assert res.returncode == 2 and "does not exist" in res.stderr, res.stderr


def test_answers_match_direct_onnx_runtime(server, bodies, reference):
    """32 requests at concurrency 8: every one answered, its top-1, probability and token counts the direct run's."""
    run = run_load(server.url, bodies, requests=32, concurrency=8, timeout_s=REQUEST_S, max_seconds=240)
    s = summary(run)
    assert s["ok"] == 32, s
    assert check(run.outcomes, reference) == []
    assert all(o.answer["model"] == "deit_tiny" and len(o.answer["top5"]) == 5 for o in run.outcomes)
    assert sum(int(b) * n for b, n in s["batches_by_size"].items()) == 32 and s["mean_batch_size"] >= 1


def _post(url: str, body: bytes, content_type: str | None) -> tuple[int, dict]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=REQUEST_S)
    try:
        conn.request("POST", "/predict", body=body, headers={"Content-Type": content_type} if content_type else {})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def test_bad_bodies_get_one_line_4xx_and_it_keeps_serving(server, bodies):
    import io

    from PIL import Image

    big = io.BytesIO()
    Image.new("1", (10_000, 10_000)).save(big, "PNG")  # 100 megapixels in 12 KB
    jpeg = next(b for b in bodies if b.content_type == "image/jpeg")
    cases = [
        (b"%PDF-1.4 not an image", "image/jpeg", 400, "not an image in a supported format"),
        (b"", "image/jpeg", 400, "empty body"),
        (big.getvalue(), "image/png", 413, "exceeds limit of 89478485 pixels"),
        (jpeg.data, "text/plain", 415, "content type 'text/plain' is not an image"),
    ]
    for body, content_type, status, fragment in cases:
        got, payload = _post(server.url, body, content_type)
        assert got == status and fragment in payload["error"] and "\n" not in payload["error"], (got, payload)
    status, payload = _post(server.url, jpeg.data, None)  # no content type: the bytes decide
    assert status == 200 and payload["token_counts"] == [99], payload
    assert server.health() == {"status": "ok", "model": "deit_tiny", "device": "cpu", "max_batch_size": 8,
                               "batch_wait_ms": 5.0}  # fmt: skip


def test_killed_replica_loses_no_request_and_is_restarted(server, bodies, reference, request):
    """SIGKILL to one replica of two after 12 answers of 64: every request ends in time, answered 200 (and right) or
    a clean 5xx; Ray starts a new replica and the server answers again."""
    replicas = server.replica_pids()
    assert len(replicas) == 2, replicas
    killed = threading.Event()

    def kill_one(done: int) -> None:
        if done >= 12 and not killed.is_set():
            killed.set()
            os.kill(replicas[0], signal.SIGKILL)

    t0 = time.monotonic()
    run = run_load(
        server.url, bodies, requests=64, concurrency=8, timeout_s=REQUEST_S, max_seconds=240, on_outcome=kill_one
    )
    s = summary(run)
    request.node.user_properties.append(("ci_summary", f"statuses {s['statuses']}, no answer {s['no_answer']}"))
    assert killed.is_set()
    assert len(run.outcomes) == 64 and all(o.status is not None for o in run.outcomes), summary(run)
    assert all(o.status == 200 or 500 <= o.status < 600 for o in run.outcomes), summary(run)
    assert max(o.latency_s for o in run.outcomes) < REQUEST_S and time.monotonic() - t0 < 240
    assert sum(o.status == 200 for o in run.outcomes) >= 32, summary(run)  # the other replica kept answering
    assert check(run.outcomes, reference) == []
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        now = server.replica_pids()
        if len(now) == 2 and replicas[0] not in now:
            break
        time.sleep(1)
    assert len(now) == 2 and replicas[0] not in now, (replicas, now)
    again = run_load(server.url, bodies, requests=8, concurrency=4, timeout_s=REQUEST_S, max_seconds=240)
    assert summary(again)["ok"] == 8


def test_sigterm_stops_it_leaving_no_process(server):
    before = server.running()
    assert len(before) > 5  # the command, Ray's GCS, raylet, agents, controller, proxy, replicas
    rc = server.stop(signal.SIGTERM, timeout_s=120)
    assert rc == 130, server.stderr[-2000:]
    assert _last_line(server.stderr) == "error: interrupted by SIGTERM; nothing it wrote is left"
    assert server.running() == [], [(p.pid, p.name()) for p in server.running()]


def _last_line(text: str) -> str:
    return text.strip().splitlines()[-1]
