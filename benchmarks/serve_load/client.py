"""The load loop: `requests` POSTs to /predict from `concurrency` threads, each on its own keep-alive connection,
bounded in count, per-request time and total time; loopback addresses only.

    run = run_load("http://127.0.0.1:8000", bodies, requests=256, concurrency=8)
    summary(run)   # img/s, latency p50/p90/p99, statuses, requests by the batch size they ran in
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import numpy as np

__all__ = ["Body", "LoadRun", "Outcome", "loopback_endpoint", "post", "run_load", "summary"]

BATCH_HEADER = "X-Raggedvit-Batch-Size"  # raggedvit.serving.deployment.BATCH_HEADER (no Ray import here)


@dataclass(frozen=True)
class Body:
    """One request body: the image's name, its content type and the file's bytes."""

    name: str
    content_type: str
    data: bytes


@dataclass(frozen=True)
class Outcome:
    """One request: `index` into the run's bodies (request i sends bodies[i % len(bodies)]); `status` None when no
    answer came (connection error or timeout: `error` says which)."""

    index: int
    status: int | None
    latency_s: float
    batch_size: int | None = None
    answer: dict[str, Any] | None = None
    error: str | None = None


@dataclass(frozen=True)
class LoadRun:
    outcomes: list[Outcome]  # by request index; requests past the deadline were not sent
    wall_s: float
    requests: int
    concurrency: int


def loopback_endpoint(url: str) -> tuple[str, int]:
    """(host, port) of an http:// URL whose host is a loopback address (127.0.0.0/8, ::1, localhost); ValueError
    for any other: this load generator sends traffic to this machine only."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"expected http://HOST:PORT, got {url!r}")
    host = parts.hostname
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except socket.gaierror as e:
        raise ValueError(f"{host!r} does not resolve: {e.strerror}") from None
    if not all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses):
        raise ValueError(f"{host!r} is not a loopback address: the load generator sends to this machine only")
    return host, parts.port or 80


def post(conn: http.client.HTTPConnection, index: int, body: Body) -> Outcome:
    """One POST /predict on `conn` (reconnected after an error by http.client); its Outcome."""
    t0 = time.perf_counter()
    try:
        conn.request("POST", "/predict", body=body.data, headers={"Content-Type": body.content_type})
        resp = conn.getresponse()
        raw = resp.read()
    except (OSError, http.client.HTTPException) as e:
        conn.close()
        return Outcome(index, None, time.perf_counter() - t0, error=f"{type(e).__name__}: {e}")
    latency = time.perf_counter() - t0
    try:
        payload = json.loads(raw)
    except ValueError:
        payload = {"error": raw[:200].decode("utf-8", "replace")}
    batch = resp.getheader(BATCH_HEADER)
    if resp.status == 200:
        return Outcome(index, 200, latency, int(batch) if batch else None, answer=payload)
    return Outcome(index, resp.status, latency, error=str(payload.get("error") or payload.get("detail") or payload))


def run_load(
    url: str,
    bodies: Sequence[Body],
    *,
    requests: int,
    concurrency: int,
    timeout_s: float = 60.0,
    max_seconds: float = 600.0,
    on_outcome: Callable[[int], None] | None = None,
) -> LoadRun:
    """`requests` POSTs at `concurrency`; no request starts after `max_seconds`, none waits past `timeout_s`.
    on_outcome(n) is called (from a load thread) after each answer or failure, n the outcomes so far."""
    if requests < 1 or concurrency < 1 or not bodies:
        raise ValueError(f"need requests, concurrency >= 1 and bodies, got {requests}, {concurrency}, {len(bodies)}")
    host, port = loopback_endpoint(url)
    lock = threading.Lock()
    next_index = iter(range(requests))
    outcomes: list[Outcome] = []
    t0 = time.perf_counter()

    def worker() -> None:
        conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
        try:
            while time.perf_counter() - t0 < max_seconds:
                with lock:
                    i = next(next_index, None)
                if i is None:
                    return
                outcome = post(conn, i, bodies[i % len(bodies)])
                with lock:
                    outcomes.append(outcome)
                    n = len(outcomes)
                if on_outcome is not None:
                    on_outcome(n)
        finally:
            conn.close()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(concurrency, requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max_seconds + timeout_s + 5)
    wall = time.perf_counter() - t0
    with lock:
        done = sorted(outcomes, key=lambda o: o.index)
    return LoadRun(done, wall, requests, concurrency)


def summary(run: LoadRun) -> dict[str, Any]:
    """img/s (answered 200s per wall second), latency percentiles in ms of the 200s, the count of each status, the
    requests that got no answer or were not sent, and the batches the server formed: for each batch size b, the
    requests that ran in a batch of b and the batches that makes (requests / b)."""
    ok = [o for o in run.outcomes if o.status == 200]
    lat = np.array([o.latency_s for o in ok]) * 1e3
    by_size = Counter(o.batch_size for o in ok if o.batch_size)
    batches = sum(n / b for b, n in by_size.items())
    pct = {f"p{q}": round(float(np.percentile(lat, q)), 2) for q in (50, 90, 99)} if len(lat) else {}
    return {
        "requests": run.requests,
        "concurrency": run.concurrency,
        "ok": len(ok),
        "statuses": {str(k): v for k, v in sorted(Counter(o.status for o in run.outcomes if o.status).items())},
        "no_answer": sum(o.status is None for o in run.outcomes),
        "not_sent": run.requests - len(run.outcomes),
        "wall_s": round(run.wall_s, 3),
        "img_per_s": round(len(ok) / run.wall_s, 2),
        "latency_ms": {**pct, "max": round(float(lat.max()), 2)} if len(lat) else {},
        "requests_by_batch_size": {str(b): n for b, n in sorted(by_size.items())},
        "batches_by_size": {str(b): round(n / b, 2) for b, n in sorted(by_size.items())},
        "mean_batch_size": round(sum(by_size.values()) / batches, 2) if by_size else None,
    }
