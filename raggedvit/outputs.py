"""Atomic outputs: everything is written in a temp folder beside the targets, then renamed into place.

`staging_dir` is the one mechanism (export, triton-repo, validate's report and bench's JSON use it): SIGINT and
SIGTERM raise `Interrupted` from before the temp folder exists, its name is fixed before it is created (so the
cleanup knows it at every moment) and fits the file system's name limit whatever the target's name, and it is
removed however the block ends, a second signal included. The handler takes one signal: a cleanup that signal cut
short is finished by running its idempotent removal again, and one it skipped (it landed as a block's exit began) is
done by the enclosing undo_on_interrupt. `commit` renames staged entries onto their targets as a set, holding an
exclusive lock on the target folder (writers of one folder take turns: two exports to one `-o` leave one run's
`.onnx` and `.data`, never a mix): a failed rename or a signal before the last one undoes the earlier ones (a report
is both its files or neither). `undo_on_interrupt` extends that to a whole command: what it committed is removed
again when a signal ends it, so an interrupted command leaves nothing (but progress written `resumable`).
`check_target` refuses a target that cannot be written before any work is done.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

__all__ = [
    "Interrupted",
    "atomic_write",
    "atomic_write_all",
    "check_target",
    "commit",
    "interrupts_raise",
    "name_max",
    "open_file_mode",
    "raise_pending_interrupt",
    "staging_dir",
    "undo_on_interrupt",
]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_UNWIND = (KeyboardInterrupt,)  # with Interrupted (below): the signals that unwind the stack


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived. A BaseException, like KeyboardInterrupt: `except Exception` does not stop it,
    cleanup in `finally` (staging_dir) runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signal_name = signal.Signals(signum).name


_received: list[int] = []  # the signals _raise_interrupted took since the handlers were installed


def _raise_interrupted(signum: int, frame) -> None:
    for sig in _SIGNALS:  # a second signal must not disturb the cleanup
        signal.signal(sig, signal.SIG_IGN)
    _received.append(signum)
    raise Interrupted(signum)


def raise_pending_interrupt() -> None:
    """Raise Interrupted again for a signal whose exception was lost: Python drops an exception raised while a
    __del__ method or a weakref callback runs ("Exception ignored in ..."), and the handler has already ignored
    further signals, so the command would run on, deaf to Ctrl-C. Loops of long steps call this between steps."""
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
    for sig in _SIGNALS:
        signal.signal(sig, _raise_interrupted)

    def restore() -> None:
        for sig, handler in current.items():
            signal.signal(sig, handler)

    return restore


def _finish(step: Callable[[], None]) -> None:
    """Runs `step` to its end even if a signal interrupts it (the handler ignores further signals, so the retry
    runs undisturbed), then re-raises that signal's exception."""
    pending: BaseException | None = None
    for _ in range(3):
        try:
            step()
            break
        except (Interrupted, *_UNWIND) as e:
            pending = pending or e
    if pending is not None:
        raise pending


def _remove(entry: Path) -> None:
    """Remove `entry`, a folder with everything in it, if it is there. Idempotent, so a cleanup that a signal cut short
    is finished by running it again (shutil.rmtree is not: cut between its close() and its bookkeeping, it closes the
    descriptor a second time, and the OSError replaces the interrupt). Other errors are ignored, as with rmtree's
    ignore_errors. Links are removed, never followed."""
    try:
        if os.path.isdir(entry) and not os.path.islink(entry):
            for child in os.listdir(entry):  # a list at once: no directory descriptor is left open by a signal
                _remove(Path(entry) / child)
            os.rmdir(entry)
        else:
            os.unlink(entry)
    except OSError:
        pass


_NAME_MAX = 255  # POSIX file systems' usual limit, where pathconf cannot tell


def name_max(folder: str | Path) -> int:
    """The longest file name (bytes) the file system of `folder` takes (255 where it cannot be asked)."""
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (OSError, ValueError):
        return _NAME_MAX


def _staging_name(parent: Path, name: str) -> str:
    """`.NAME.<8 hex>`, NAME cut (at a character boundary) so that the whole fits the folder's name limit: a legal
    target name of up to the limit still gets a staging folder."""
    suffix = f".{secrets.token_hex(4)}"
    room = max(name_max(parent) - 1 - len(suffix), 1)
    cut = os.fsencode(name)[:room].decode("utf-8", "ignore")  # a character split by the cut is dropped
    return f".{cut or 'out'}{suffix}"


# Staging folders that exist now. Each is removed when its block ends; one whose cleanup a signal skipped (it landed as
# the block's exit began) is removed by the enclosing undo_on_interrupt, which runs undisturbed: the handler takes one
# signal.
_live: list[Path] = []


def _sweep(entries: list[Path]) -> None:
    """Remove `entries` (staging folders or committed targets) and forget them in _live, to the end even if a signal
    lands meanwhile (re-raised after: see _finish)."""

    def step() -> None:
        for entry in list(entries):
            _remove(entry)
            if entry in _live:
                _live.remove(entry)

    _finish(step)


class staging_dir:  # noqa: N801 - used as a function: `with staging_dir(parent, name) as tmp:`
    """A new empty folder `parent/.NAME.<random>` for outputs to be committed beside it (same file system, so the
    renames are atomic); removed with everything left in it when the block ends, normally or not. NAME is shortened
    where the target's name leaves no room for the suffix.

    A class, not a generator: contextlib's __exit__ runs several Python lines before the generator's `finally`, and a
    signal landing there skipped the cleanup."""

    def __init__(self, parent: str | Path, name: str) -> None:
        self._parent, self._name = Path(parent), name

    def __enter__(self) -> Path:
        self._restore = interrupts_raise(only_defaults=True)  # installed before the folder can exist
        self._tmp = tmp = self._parent / _staging_name(self._parent, self._name)
        _live.append(tmp)  # known before it exists: every later cleanup finds it
        try:
            os.mkdir(tmp, 0o700)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return tmp

    def __exit__(self, typ, exc, tb) -> None:
        try:
            _sweep([self._tmp])
        finally:
            self._restore()


@contextmanager
def _folder_lock(folder: Path) -> Iterator[None]:
    """An exclusive flock on `folder` itself (no lock file is left behind) for the block: writers committing into
    one folder take turns. Where the file system has no flock (some network mounts), the block runs unlocked."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        fd = -1  # the renames report the folder's problem
    try:
        if fd >= 0:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError as e:
                if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF):
                    raise
        yield
    finally:
        if fd >= 0:
            os.close(fd)  # releases the lock


_open: list[undo_on_interrupt] = []  # the open blocks: each records the targets committed while it is open


def commit(moves: Mapping[Path, Path], *, resumable: bool = False) -> None:
    """os.replace each staged entry onto its target, as a set, under an exclusive lock of the targets' folder (see
    _folder_lock): if a rename fails or a signal arrives before the last one is done, the targets already replaced
    are removed again (none of the new outputs stays), and the OSError or Interrupted propagates. Inside an
    undo_on_interrupt block the targets are recorded for it, unless `resumable`: progress a later run resumes from
    (a sweep's finished points), which an interrupt must leave."""
    started: list[tuple[Path, Path]] = []
    folders = sorted({Path(dst).parent for dst in moves.values()})
    try:
        with contextlib.ExitStack() as locks:
            for folder in folders:  # one order for every writer: no deadlock between two multi-folder commits
                locks.enter_context(_folder_lock(folder))
            for src, dst in moves.items():
                started.append((src, dst))  # recorded first: a signal right after the rename still undoes it
                os.replace(src, dst)
                for (
                    block
                ) in _open:  # at once: if an OSError and then a signal cut the undo below, the block's undoes it
                    (block._kept if resumable else block._done).append(Path(dst))
    except BaseException:
        _finish(lambda: [_remove(dst) for src, dst in started if not os.path.lexists(src)])
        raise


class undo_on_interrupt:  # noqa: N801 - used as a function: `with undo_on_interrupt():`
    """Outputs committed inside the block are removed again if it ends by SIGINT or SIGTERM (Interrupted,
    KeyboardInterrupt, or the exception types `also`: what a framework turns them into), a signal that lands after
    the last rename included: an interrupted command leaves nothing (exit 130), a command that was not interrupted
    leaves all of its outputs. Resumable outputs stay; the exception then names them in its `kept` attribute. Staging
    folders whose own cleanup a signal skipped are removed too.

    A signal counts when its exception ends the block, and also when the handler took one during the block while
    another exception ends it (the signal landed in a cleanup that then failed: Interrupted is raised from it) or none
    does (a finalizer swallowed it: it is raised here). The outermost handler of a command calls `undo(exc)` again
    with the exception that ended it: a signal can land as the block's exit begins, before any of it runs, or after
    the block (the handler takes one signal, so that call runs undisturbed)."""

    def __init__(self, also: tuple[type[BaseException], ...] = ()) -> None:
        self._signals = (Interrupted, *_UNWIND, *also)
        self._done: list[Path] = []  # committed in the block: removed on an interrupt
        self._kept: list[Path] = []  # committed `resumable`: they stay
        self._live_before: set[Path] = set()
        self._received_from = 0

    def __enter__(self) -> undo_on_interrupt:
        self._live_before, self._received_from = set(_live), len(_received)
        _open.append(self)
        return self

    def __exit__(self, typ, exc, tb) -> bool:
        try:
            self.undo(exc)
        except self._signals as e:  # the signal landed as the block ended: undo what it wrote, then raise it
            self.undo(e)
            raise
        return False

    def undo(self, exc: BaseException | None) -> None:
        """End the block (idempotent): remove the staging folders a skipped cleanup left, and, if `exc` is a signal's
        exception or a signal arrived meanwhile, the outputs committed in the block (raising Interrupted if `exc` is
        not one: the command ends as interrupted)."""
        if self in _open:
            _open.remove(self)
        _sweep([p for p in _live if p not in self._live_before])
        late = len(_received) > self._received_from
        if not (isinstance(exc, self._signals) or late):
            return
        _sweep(self._done)
        self._done.clear()
        if not isinstance(exc, self._signals):  # swallowed by a finalizer, or replaced by a cleanup's error
            raise Interrupted(_received[-1]) from exc
        if self._kept:
            exc.kept = sorted(set(self._kept))  # type: ignore[attr-defined]


def check_target(path: str | Path) -> None:
    """OSError (with the target as its filename) unless `path` can be written now, before any work is done: its name
    fits the file system's limit (ENAMETOOLONG) and its folder takes a new entry, which is tried by creating and
    removing the staging folder the write would use (os.access says yes to root on read-only mounts and /proc)."""
    path = Path(path)
    limit = name_max(path.parent)
    if len(os.fsencode(path.name)) > limit:
        raise OSError(errno.ENAMETOOLONG, f"File name too long ({len(os.fsencode(path.name))} bytes, the limit here "
                      f"is {limit})", str(path))  # fmt: skip
    try:
        with staging_dir(path.parent, path.name):
            pass
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(path)) from None


def atomic_write(path: str | Path, data: bytes | str) -> Path:
    """Write `data` (str as UTF-8) to `path` atomically; the folder must exist. Returns the path.

    The file gets the permissions a plain open() would give it (0666 minus the umask)."""
    path = Path(path)
    atomic_write_all({path: data})
    return path


def atomic_write_all(files: Mapping[Path, bytes | str], *, resumable: bool = False) -> list[Path]:
    """Write several files of one folder atomically as a set: all of them or none (see commit, and its `resumable`)."""
    paths = [Path(p) for p in files]
    if not paths:
        return []
    parent = paths[0].parent
    if any(p.parent != parent for p in paths):
        raise ValueError(f"atomic_write_all writes files of one folder, got {[str(p) for p in paths]}")
    mode = open_file_mode()
    with staging_dir(parent, paths[0].name) as tmp:
        for p, data in zip(paths, files.values()):
            payload = data.encode("utf-8") if isinstance(data, str) else data
            staged = tmp / p.name
            with open(staged, "wb") as f:
                f.write(payload)
            os.chmod(staged, mode)
        commit({tmp / p.name: p for p in paths}, resumable=resumable)
    return paths


def open_file_mode() -> int:
    """The permissions a plain open() gives a new file: 0666 minus the umask (temp files start at 0600)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask
