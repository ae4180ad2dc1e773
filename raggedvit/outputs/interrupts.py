"""Interrupts: SIGINT and SIGTERM raise `Interrupted` (a BaseException, like KeyboardInterrupt), so `finally` blocks
clean up (raggedvit.outputs removes what a command wrote); the handler takes one signal, so a cleanup runs
undisturbed once it started (`run_to_end`).

Python drops an exception raised while a finalizer runs (a __del__ method, a weakref callback such as those of
torch's WeakKeyDictionaries) and prints "Exception ignored in ... Traceback". While the handlers are installed, such
an Interrupted is not printed: it is raised again at the next line of the code the finalizer interrupted, so Ctrl-C
ends a command at once; `raise_pending_interrupt` raises it between the steps of a loop where it was lost otherwise.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType

__all__ = [
    "SIGNAL_EXCEPTIONS",
    "Interrupted",
    "interrupts_raise",
    "raise_pending_interrupt",
    "run_to_end",
    "signals_taken",
]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived. A BaseException, like KeyboardInterrupt: `except Exception` does not stop it,
    cleanup in `finally` (staging_dir) runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signal_name = signal.Signals(signum).name


SIGNAL_EXCEPTIONS = (Interrupted, KeyboardInterrupt)  # the exceptions a signal unwinds the stack with


_received: list[int] = []  # the signals _raise_interrupted took since the handlers were installed


def signals_taken() -> tuple[int, ...]:
    """The signals the handler took since the handlers were installed (interrupts_raise), in order."""
    return tuple(_received)


def _raise_interrupted(signum: int, frame) -> None:
    for sig in _SIGNALS:  # a second signal must not disturb the cleanup
        signal.signal(sig, signal.SIG_IGN)
    _received.append(signum)
    raise Interrupted(signum)


def raise_pending_interrupt() -> None:
    """Raise Interrupted again for a signal the handler took: after its exception was lost (code that caught and
    dropped it, or a finalizer with no Python frame left to raise it in), the handler ignores further signals, so the
    command would run on, deaf to Ctrl-C. Loops of long steps call this between steps."""
    if _received:
        raise Interrupted(_received[-1])


def interrupts_raise(*, only_defaults: bool = False) -> Callable[[], None]:
    """SIGINT and SIGTERM raise Interrupted in the main thread from now on; returns the function that restores the
    previous handlers (a no-op outside the main thread, where handlers cannot be set). only_defaults: leave the
    handlers alone unless both are Python's defaults (a program's own handlers, or ours, stay)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    current = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    defaults = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
    if only_defaults and current != defaults:
        return lambda: None
    _received.clear()  # a new command: earlier signals were delivered to theirs
    previous_hook = sys.unraisablehook
    sys.unraisablehook = _unraisable_hook(previous_hook)
    for sig in _SIGNALS:
        signal.signal(sig, _raise_interrupted)

    def restore() -> None:
        for sig, handler in current.items():
            signal.signal(sig, handler)
        sys.unraisablehook = previous_hook

    return restore


def _unraisable_hook(previous: Callable) -> Callable:
    """sys.unraisablehook while the handlers are ours: an Interrupted that Python dropped because it was raised while a
    finalizer (a __del__ method, a weakref callback such as WeakKeyDictionary's) ran is not printed ("Exception ignored
    in ... Traceback") but raised again where the finalizer ran (_raise_late); anything else goes to `previous`."""

    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, Interrupted) and _received:
            _raise_late(sys._getframe(1), _received[-1])  # the frame the finalizer interrupted (called from C)
            return
        previous(unraisable)

    return hook


def _raise_late(frame: FrameType | None, signum: int) -> None:
    """Raise Interrupted(signum) at the next line that `frame` or one of its callers runs, as a debugger stops at a
    breakpoint: each gets a one-shot trace function (Python unsets tracing when one raises). Frames called meanwhile
    are not traced. Raised in another finalizer, it is dropped again and comes back here, one frame further out."""
    frames: list[FrameType] = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    if not frames:  # no Python frame to raise in: raise_pending_interrupt raises it between steps
        return

    def fire(frame: FrameType, event: str, arg) -> None:
        for f in frames:
            f.f_trace = None
        raise Interrupted(signum)

    for f in frames:
        f.f_trace = fire
    sys.settrace(_untraced)


def _untraced(frame: FrameType, event: str, arg) -> None:
    """The global trace function while _raise_late waits: a frame called meanwhile is not traced."""
    return None


def run_to_end(step: Callable[[], None]) -> None:
    """Runs `step` to its end even if a signal interrupts it (the handler ignores further signals, so the retry
    runs undisturbed), then re-raises that signal's exception."""
    pending: BaseException | None = None
    for _ in range(3):
        try:
            step()
            break
        except SIGNAL_EXCEPTIONS as e:
            pending = pending or e
    if pending is not None:
        raise pending
