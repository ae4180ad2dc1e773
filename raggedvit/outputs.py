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
again when a signal ends it, so an interrupted command leaves nothing (but progress written `resumable`, whose
commit cut short puts the previous set back). `held_folder` holds that lock for a long block (a sweep's run) and
removes the folders it created if nothing was written in them. `check_target` refuses a target that cannot be written
before any work is done. The signal handling (Interrupted, interrupts_raise, raise_pending_interrupt) is
raggedvit.interrupts', re-exported here.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from raggedvit.interrupts import (
    SIGNAL_EXCEPTIONS,
    Interrupted,
    interrupts_raise,
    raise_pending_interrupt,
    run_to_end,
    signals_taken,
)

__all__ = [
    "Interrupted",
    "atomic_write",
    "atomic_write_all",
    "check_target",
    "commit",
    "held_folder",
    "interrupts_raise",
    "name_max",
    "open_file_mode",
    "raise_pending_interrupt",
    "staging_dir",
    "undo_on_interrupt",
]


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
    lands meanwhile (re-raised after: see run_to_end)."""

    def step() -> None:
        for entry in list(entries):
            _remove(entry)
            if entry in _live:
                _live.remove(entry)

    run_to_end(step)


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


_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF)  # file systems without flock
_held: dict[tuple[int, int], int] = {}  # folders (st_dev, st_ino) that a held_folder block of this process locks


def _identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


@contextmanager
def _folder_lock(folder: Path) -> Iterator[None]:
    """An exclusive flock on `folder` itself (no lock file is left behind) for the block: writers committing into
    one folder take turns. Where the file system has no flock (some network mounts), the block runs unlocked; where
    this process holds the folder (held_folder), it runs at once."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        fd = -1  # the renames report the folder's problem
    try:
        if fd >= 0 and _identity(fd) not in _held:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError as e:
                if e.errno not in _NO_FLOCK:
                    raise
        yield
    finally:
        if fd >= 0:
            os.close(fd)  # releases the lock


class held_folder:  # noqa: N801 - used as a function: `with held_folder(out):`
    """`folder`, created (with its missing parents) if need be, under the exclusive lock that commit takes, for the
    whole block: commits into it from this process go through, another process's commit waits for the block's end,
    and a second holder is refused (BlockingIOError naming the folder) after `wait_s`. The folders the block created
    are removed when it ends if they are empty: a run that wrote nothing leaves nothing, whatever ended it.

    A class, like staging_dir: the cleanup runs to its end however a signal lands in it."""

    def __init__(self, folder: str | Path, *, wait_s: float = 5.0) -> None:
        self._folder, self._wait_s = Path(folder), wait_s
        self._made: list[Path] = []
        self._fd = -1
        self._key: tuple[int, int] | None = None

    def __enter__(self) -> Path:
        try:
            deadline = time.monotonic() + self._wait_s
            while not self._lock():
                if time.monotonic() > deadline:
                    raise BlockingIOError(errno.EWOULDBLOCK, "in use by another writer", str(self._folder))
                time.sleep(0.05)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self._folder

    def _make(self) -> None:
        missing = []
        p = self._folder
        while not os.path.lexists(p) and p != p.parent:
            missing.append(p)
            p = p.parent
        for p in reversed(missing):
            self._made.append(p)  # known before it exists: the cleanup finds it at every moment
            try:
                os.mkdir(p)
            except FileExistsError:
                self._made.remove(p)  # another writer made it: not ours to remove

    def _lock(self) -> bool:
        """Lock the folder (made first if missing); False while another holder has it. The folder a last holder
        removed meanwhile (it had made it, and nothing was written) is made again."""
        self._make()
        self._fd = fd = os.open(self._folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in _NO_FLOCK:
                self._fd = -1
                os.close(fd)
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    return False
                raise
        try:
            here = os.stat(self._folder)
        except FileNotFoundError:
            here = None
        if here is None or (here.st_dev, here.st_ino) != _identity(fd):
            self._fd = -1
            os.close(fd)
            return False
        self._key = _identity(fd)
        _held[self._key] = _held.get(self._key, 0) + 1
        return True

    def __exit__(self, typ, exc, tb) -> None:
        def step() -> None:
            key, self._key = self._key, None
            if key is not None:
                _held[key] -= 1
                if not _held[key]:
                    del _held[key]
            for p in reversed(self._made):  # the deepest first; one that holds anything stays, with its parents
                try:
                    os.rmdir(p)
                except OSError:
                    pass
            self._made.clear()
            fd, self._fd = self._fd, -1
            if fd >= 0:
                os.close(fd)  # releases the lock

        run_to_end(step)


_open: list[undo_on_interrupt] = []  # the open blocks: each records the targets committed while it is open


def commit(moves: Mapping[Path, Path], *, resumable: bool = False) -> None:
    """os.replace each staged entry onto its target, as a set, under an exclusive lock of the targets' folder (see
    _folder_lock): if a rename fails or a signal arrives before the last one is done, the targets already replaced
    are removed again (none of the new outputs stays), and the OSError or Interrupted propagates. Inside an
    undo_on_interrupt block the targets are recorded for it, unless `resumable`: progress a later run resumes from
    (a sweep's finished points), which an interrupt must leave; a resumable commit cut short puts back the files it
    replaced (hard links made before the first rename), so the set on disk is the previous one or the new one."""
    folders = sorted({Path(dst).parent for dst in moves.values()})
    with staging_dir(folders[0], "previous") if resumable and folders else contextlib.nullcontext() as saved:
        _commit(moves, resumable, folders, saved)


def _commit(moves: Mapping[Path, Path], resumable: bool, folders: list[Path], saved: Path | None) -> None:
    started: list[tuple[Path, Path]] = []
    previous: dict[Path, Path] = {}  # target -> the hard link of the file it replaces

    def undo() -> None:  # idempotent: a signal that cuts it short runs it again (run_to_end)
        for src, dst in started:
            if os.path.lexists(src):  # not renamed yet
                continue
            if dst not in previous:
                _remove(dst)
            elif os.path.lexists(previous[dst]):
                try:
                    os.replace(previous[dst], dst)
                except OSError:
                    _remove(dst)

    try:
        with contextlib.ExitStack() as locks:
            for folder in folders:  # one order for every writer: no deadlock between two multi-folder commits
                locks.enter_context(_folder_lock(folder))
            for i, dst in enumerate(moves.values() if saved is not None else ()):
                if os.path.isfile(dst) and not os.path.islink(dst):
                    try:
                        os.link(dst, saved / str(i))
                    except OSError:  # no hard links here (or another file system): no way back for this one
                        continue
                    previous[Path(dst)] = saved / str(i)
            for src, dst in moves.items():
                started.append((src, Path(dst)))  # recorded first: a signal right after the rename still undoes it
                os.replace(src, dst)
                for (
                    block
                ) in _open:  # at once: if an OSError and then a signal cut the undo below, the block's undoes it
                    (block._kept if resumable else block._done).append(Path(dst))
    except BaseException:
        run_to_end(undo)
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
        self._signals = (*SIGNAL_EXCEPTIONS, *also)
        self._done: list[Path] = []  # committed in the block: removed on an interrupt
        self._kept: list[Path] = []  # committed `resumable`: they stay
        self._live_before: set[Path] = set()
        self._received_from = 0

    def __enter__(self) -> undo_on_interrupt:
        self._live_before, self._received_from = set(_live), len(signals_taken())
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
        late = len(signals_taken()) > self._received_from
        if not (isinstance(exc, self._signals) or late):
            return
        _sweep(self._done)
        self._done.clear()
        if not isinstance(exc, self._signals):  # swallowed by a finalizer, or replaced by a cleanup's error
            raise Interrupted(signals_taken()[-1]) from exc
        kept = sorted(p for p in set(self._kept) if os.path.lexists(p))  # a first write cut short left none
        if kept:
            exc.kept = kept  # type: ignore[attr-defined]


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
