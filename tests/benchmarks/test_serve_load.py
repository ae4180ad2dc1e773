"""benchmarks.serve_load without a server: loopback addresses only, the summary's arithmetic, the answer check and
the command line's refusals (the load against a real server: tests/serving/test_serve.py)."""

from __future__ import annotations

import pytest

from benchmarks.serve_load.client import LoadRun, Outcome, loopback_endpoint, summary
from benchmarks.serve_load.reference import Reference, check
from benchmarks.serve_load.run import main


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8000", "http://localhost:8000", "http://127.8.9.10:1", "http://[::1]:80"]
)
def test_loopback_urls_are_taken(url):
    host, port = loopback_endpoint(url)
    assert port in (8000, 1, 80) and host


@pytest.mark.parametrize(
    "url,fragment",
    [
        ("http://192.0.2.2:8000", "is not a loopback address"),
        ("http://10.0.0.1:8000", "is not a loopback address"),
        ("https://127.0.0.1:8000", "expected http://HOST:PORT"),
        ("127.0.0.1:8000", "expected http://HOST:PORT"),
    ],
)
def test_other_addresses_are_refused(url, fragment):
    with pytest.raises(ValueError, match=fragment):
        loopback_endpoint(url)


def _ok(i: int, batch: int, ms: float, top1: int = 3, tokens: list[int] | None = None) -> Outcome:
    answer = {"top5": [[top1, 0.5]], "token_counts": tokens or [99], "model": "m"}
    return Outcome(i, 200, ms / 1e3, batch, answer)


def test_summary_counts_batches_statuses_and_percentiles():
    outcomes = [_ok(i, 4, 10.0 + i) for i in range(8)] + [_ok(8, 1, 100.0), Outcome(9, 500, 0.2, error="x")]
    outcomes.append(Outcome(10, None, 60.0, error="TimeoutError: timed out"))
    s = summary(LoadRun(outcomes, wall_s=2.0, requests=12, concurrency=4))
    assert (s["ok"], s["img_per_s"], s["no_answer"], s["not_sent"]) == (9, 4.5, 1, 1)
    assert s["statuses"] == {"200": 9, "500": 1}
    assert s["requests_by_batch_size"] == {"1": 1, "4": 8} and s["batches_by_size"] == {"1": 1.0, "4": 2.0}
    assert s["mean_batch_size"] == 3.0 and s["latency_ms"]["p50"] == 14.0 and s["latency_ms"]["max"] == 100.0


def test_check_names_each_differing_answer():
    ref = [Reference(3, 0.5, [99]), Reference(7, 0.5, [99])]
    outcomes = [_ok(0, 1, 1.0), _ok(1, 1, 1.0), _ok(2, 1, 1.0, tokens=[98]), Outcome(3, 500, 0.1)]
    bad = check(outcomes, ref)
    assert len(bad) == 2 and bad[0].startswith("request 1: served top-1 3") and "tokens [98]" in bad[1]


@pytest.mark.parametrize(
    "argv,fragment",
    [
        ([], "give --url (a running server) or --serve"),
        (["--url", "http://127.0.0.1:1"], "--url needs --model"),
        (["--url", "http://127.0.0.1:1", "--model", "m.onnx", "--requests", "0"], "must be >= 1"),
    ],
)
def test_command_line_refusals(argv, fragment, capsys):
    with pytest.raises(SystemExit) as err:
        main(argv)
    assert err.value.code == 2 and fragment in capsys.readouterr().err
