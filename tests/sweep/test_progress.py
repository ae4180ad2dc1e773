"""A sweep's progress off a terminal: the count of points first, then a line per point with the time left."""

from __future__ import annotations

import io

from raggedvit.sweep.progress import Progress, duration


def test_lines_off_a_terminal() -> None:
    stream = io.StringIO()  # not a terminal: plain lines, no bar
    bar = Progress(3, enabled=True, stream=stream)
    bar.note("3 points")
    bar.start("none")
    bar.finished("none", 40.0)
    bar.finished("topk-l2 keep=0.5 at=4", 20.0)
    bar.finished("topk-l2 keep=0.7 at=4", 30.0)
    bar.close()
    assert stream.getvalue().splitlines() == [
        "sweep: 3 points",
        "sweep: 1/3 none in 40.0 s; about 80 s left",  # the first point's time times the points left
        "sweep: 2/3 topk-l2 keep=0.5 at=4 in 20.0 s; about 30 s left",  # then the mean so far
        "sweep: 3/3 topk-l2 keep=0.7 at=4 in 30.0 s",
    ]
    quiet = io.StringIO()
    off = Progress(1, enabled=False, stream=quiet)
    off.note("x")
    off.finished("none", 1.0)
    assert quiet.getvalue() == ""


def test_durations_read_as_a_person_reads_them() -> None:
    assert [duration(s) for s in (0.4, 45, 89, 90, 725, 5360, 5400, 12000)] == [
        "0 s", "45 s", "89 s", "2 min", "12 min", "89 min", "1 h 30 min", "3 h 20 min"
    ]  # fmt: skip


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bar_on_a_terminal() -> None:
    """On a terminal the lines of text print above a tqdm bar, whose text says the point done and the time left."""
    stream = _Terminal()
    bar = Progress(2, enabled=True, stream=stream)
    bar.note("2 points")
    bar.start("none")
    bar.finished("none", 30.0)
    bar.close()
    text = stream.getvalue()
    assert "sweep: 2 points\n" in text and "1/2" in text and "none in 30.0 s; about 30 s left" in text
