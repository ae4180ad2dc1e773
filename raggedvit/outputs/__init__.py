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
before any work is done.

Modules: `interrupts` (the handlers, Interrupted, signals lost in finalizers), `folders` (staging folders, the folder
lock, held_folder), `writes` (commit, undo_on_interrupt, the atomic writes); everything public is exported here.
"""

from __future__ import annotations

from raggedvit.outputs.folders import held_folder, name_max, staging_dir
from raggedvit.outputs.interrupts import Interrupted, interrupts_raise, raise_pending_interrupt
from raggedvit.outputs.writes import (
    atomic_write,
    atomic_write_all,
    check_target,
    commit,
    open_file_mode,
    undo_on_interrupt,
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
