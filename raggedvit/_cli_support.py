"""The error contract of the raggedvit CLI and the input checks its commands share.

Every command ends through `exit_status`, the one mapping from an exception to an exit code and a one-line
message: 2 for a usage or input problem (bad option, unreadable file, unusable device, out of memory, cannot
write an output), 130 for an interrupt (SIGINT or SIGTERM: both unwind the stack, so temp files are removed),
3 for anything unexpected (a bug; RAGGEDVIT_DEBUG=1 shows the traceback). A failed numerical validation is
not an exception: `validate` returns 1.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import click

from raggedvit.exporter._io import Interrupted, interrupts_raise
from raggedvit.validators.errors import OpLibraryMissing, ValidationInputError

__all__ = [
    "IGNORED_BY_POLICY",
    "CliError",
    "Interrupted",
    "check_memory",
    "check_range",
    "check_writable",
    "exit_status",
    "interrupts_raise",
    "is_ort_error",
    "refuse_ignored_options",
    "require_device",
    "warn_nonfinite",
]

_NO_ARGS = getattr(click.exceptions, "NoArgsIsHelpError", ())  # click >= 8.2: a group called without a command
INPUT_ERRORS = (ValidationInputError, OpLibraryMissing)  # typed library errors about the user's inputs

# Pruning options each policy ignores (fuse with topk-l2 / cls-mass: PruneSpec's own, more specific error).
IGNORED_BY_POLICY = {
    "none": ("prune_at", "keep", "mass", "fuse"),
    "topk-l2": ("mass",),
    "evit": ("mass",),
    "cls-mass": ("keep",),
}


class CliError(Exception):
    """A one-line user-facing error with its exit code."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def is_ort_error(exc: BaseException) -> bool:
    """An exception raised by ONNX Runtime (its pybind error types derive from Exception only)."""
    return type(exc).__module__.startswith("onnxruntime")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def exit_status(exc: BaseException) -> tuple[int, str]:
    """(exit code, one-line message) for the exception that ended a command."""
    if isinstance(exc, CliError):
        return exc.code, _one_line(str(exc))
    if isinstance(exc, _NO_ARGS):  # its message is the whole help text
        return 2, f"missing command; see '{exc.ctx.command_path if exc.ctx else 'raggedvit'} --help'"
    if isinstance(exc, click.ClickException):  # usage errors: bad option values, missing arguments
        return 2, _one_line(exc.format_message())
    if isinstance(exc, Interrupted):
        return 130, f"interrupted by {exc.signal_name}"
    if isinstance(exc, (KeyboardInterrupt, click.Abort)):
        return 130, "interrupted"
    if isinstance(exc, INPUT_ERRORS):
        return 2, _one_line(str(exc))
    if isinstance(exc, MemoryError):
        return 2, "out of memory" + (
            f": {_one_line(str(exc))}" if str(exc) else " (are the sizes asked for too large?)"
        )
    if isinstance(exc, OSError) and exc.strerror:
        where = f" {str(exc.filename)!r}" if exc.filename else ""
        return 2, f"cannot access{where}: {exc.strerror}"
    first = str(exc).splitlines()[0] if str(exc).strip() else ""
    return 3, f"internal error: {type(exc).__name__}: {first}"


def check_writable(path: Path, what: str) -> None:
    """CliError unless `path` can be created or replaced: a regular file (or nothing) in a writable folder."""
    parent = path.resolve().parent
    if path.is_dir():
        raise CliError(f"{what} {str(path)!r} is a directory")
    if path.exists() and not path.is_file():  # a device or a fifo: replacing it would be a surprise
        raise CliError(f"{what} {str(path)!r} exists and is not a regular file")
    if not parent.is_dir():
        raise CliError(f"cannot write {what} {str(path)!r}: directory {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK):
        raise CliError(f"cannot write {what} {str(path)!r}: directory {str(parent)!r} is not writable")


def check_range(option: str, value: float, lo: float, hi: float = math.inf, *, lo_open: bool = False) -> None:
    """CliError unless `value` is finite and in [lo, hi] ((lo, hi] with lo_open)."""
    above = value > lo if lo_open else value >= lo
    if not (math.isfinite(value) and above and value <= hi):
        bound = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]" if math.isfinite(hi) else None
        want = f"in {bound}" if bound else f"{'>' if lo_open else '>='} {lo:g} and finite"
        raise CliError(f"{option} must be {want}, got {value:g}")


def check_memory(what: str, nbytes: int) -> None:
    """CliError when `what` needs more than this machine's physical memory (instead of a MemoryError later)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # not available here: the MemoryError mapping remains
        return
    if nbytes > total:
        raise CliError(f"{what} needs {nbytes / 2**30:.1f} GiB of memory; this machine has {total / 2**30:.1f} GiB")


def refuse_ignored_options(ctx: click.Context, policy: str) -> None:
    """CliError for a pruning option the user passed that `policy` would ignore (defaults are fine)."""
    defaults = (click.core.ParameterSource.DEFAULT, click.core.ParameterSource.DEFAULT_MAP, None)
    for name in IGNORED_BY_POLICY[policy]:
        if ctx.get_parameter_source(name) not in defaults:
            raise CliError(f"--{name.replace('_', '-')} does not apply to --policy {policy}; leave it out")


def require_device(device: str) -> None:
    """CliError unless ONNX Runtime can run on `device`."""
    import onnxruntime as ort

    if device == "cuda" and "CUDAExecutionProvider" not in ort.get_available_providers():
        raise CliError(f"--device cuda: onnxruntime {ort.__version__} has no CUDAExecutionProvider on this machine")


def warn_nonfinite(model) -> None:
    """One 'warning:' line on stderr when the model's weights hold NaN or Inf (the export would not be finite)."""
    from raggedvit.weights import nonfinite_tensors

    bad = nonfinite_tensors(model)
    if bad:
        names = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more weight tensors" if len(bad) > 3 else "")
        click.echo(f"warning: NaN or Inf values in {names}: the exported model will not give finite outputs", err=True)


def require_onnxruntime_cli() -> None:
    """CliError (exit 2) naming the install command when `import onnxruntime` fails."""
    from raggedvit.ort_dist import OnnxRuntimeMissing, require_onnxruntime

    try:
        require_onnxruntime()
    except OnnxRuntimeMissing as e:
        raise CliError(str(e)) from None
    import onnxruntime

    onnxruntime.set_default_logger_severity(3)  # errors only: ORT's start-up warnings are not the command's output
