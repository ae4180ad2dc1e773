"""A sweep's progress on stderr: the count of points before the first one, then a line per point with an estimate of
the time left (the mean time of the points measured so far times the points left); a bar on a terminal."""

from __future__ import annotations

import sys
from typing import TextIO

__all__ = ["Progress", "duration"]


def duration(seconds: float) -> str:
    """ "45 s", "12 min", "3 h 20 min": a time left as a person reads it."""
    if seconds < 90:
        return f"{max(seconds, 0):.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 90 else f"{minutes // 60} h {minutes % 60} min"


class Progress:
    """Progress of `total` points to measure on `stream` (stderr): plain "sweep: ..." lines, or, on a terminal, a
    tqdm bar whose lines of text (`note`) print above it. Nothing with enabled=False."""

    def __init__(self, total: int, *, enabled: bool, stream: TextIO | None = None) -> None:
        self._stream = stream or sys.stderr
        self._total, self._done, self._spent = total, 0, 0.0
        self._enabled = enabled
        self._bar = None
        if enabled and self._stream.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc="sweep", unit="point", file=self._stream, dynamic_ncols=True)

    def note(self, text: str) -> None:
        """One line of text: "sweep: TEXT"."""
        if not self._enabled:
            return
        line = f"sweep: {text}"
        if self._bar is not None:
            self._bar.write(line, file=self._stream)
        else:
            print(line, file=self._stream, flush=True)

    def start(self, label: str) -> None:
        """A point starts (the bar shows its label)."""
        if self._bar is not None:
            self._bar.set_postfix_str(label)

    def finished(self, label: str, seconds: float) -> None:
        """A point took `seconds`: its line ("3/40 tome r=8 in 4.2 s; about 2 min left") or the bar's step."""
        self._done += 1
        self._spent += seconds
        left = self._total - self._done
        eta = f"; about {duration(self._spent / self._done * left)} left" if left else ""
        if self._bar is not None:
            self._bar.update()
            self._bar.set_postfix_str(f"{label} in {seconds:.1f} s{eta}")
        else:
            self.note(f"{self._done}/{self._total} {label} in {seconds:.1f} s{eta}")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
