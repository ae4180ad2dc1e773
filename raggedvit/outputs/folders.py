"""Folders of raggedvit.outputs: staging folders (removed however their block ends), the folder lock that commits
take, and held_folder (that lock for a long block)."""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from raggedvit.outputs.interrupts import interrupts_raise, run_to_end

__all__ = ["held_folder", "name_max", "staging_dir"]


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

    def __init__(self, folder: str | Path, *, wait_s: float = 2.0) -> None:
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
