"""Writes of raggedvit.outputs: commit (staged entries renamed onto their targets as a set), undo_on_interrupt (a
command's outputs removed again when a signal ends it), check_target and the atomic writes."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Mapping
from pathlib import Path

from raggedvit.outputs.folders import _folder_lock, _live, _remove, _sweep, name_max, staging_dir
from raggedvit.outputs.interrupts import SIGNAL_EXCEPTIONS, Interrupted, run_to_end, signals_taken

__all__ = ["atomic_write", "atomic_write_all", "check_target", "commit", "open_file_mode", "undo_on_interrupt"]


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
    """commit's renames; `saved`: a staging folder for the hard links of the files a resumable commit replaces."""
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
            for i, dst in enumerate(moves.values()):  # resumable: a hard link of each file about to be replaced
                if saved is not None and os.path.isfile(dst) and not os.path.islink(dst):
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
