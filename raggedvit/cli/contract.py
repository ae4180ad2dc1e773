"""The error contract of the raggedvit CLI and the input checks its commands share.

Every command ends through `exit_status`, the one mapping from an exception to an exit code and a one-line
message: 2 for a usage or input problem (bad option, unreadable file, unusable device, out of memory, cannot
write an output), 130 for an interrupt (SIGINT or SIGTERM: both unwind the stack, so temp files are removed, and
the group's undo_on_interrupt removes outputs already renamed into place: nothing is left but a sweep's finished
points, kept for --resume),
3 for anything unexpected (a bug; RAGGEDVIT_DEBUG=1 shows the traceback). A failed numerical validation is
not an exception: `validate` returns 1.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import stat
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import click

from raggedvit import InputError
from raggedvit.outputs import Interrupted, check_target, interrupts_raise, name_max
from raggedvit.policies import REGISTRY
from raggedvit.validators.errors import OpLibraryMissing

__all__ = [
    "EXPORT_DTYPES",
    "INPUT_ERRORS",
    "IGNORED_BY_POLICY",
    "CliError",
    "Interrupted",
    "check_folder",
    "check_img_size",
    "check_memory",
    "check_range",
    "check_readable_file",
    "check_image_folder",
    "check_weight_source",
    "check_writable",
    "weight_source_options",
    "exit_status",
    "interrupts_raise",
    "is_ort_error",
    "load_model",
    "note_policy_state",
    "parse_int_list",
    "quiet_numerics",
    "refuse_ignored_options",
    "refuse_unused_checkpoint",
    "require_device",
    "warn_nonfinite",
]

EXPORT_DTYPES = ("fp32", "fp16", "fp16-all")  # raggedvit.pruning.precision.DTYPES without importing torch (tested)
_NO_ARGS = getattr(click.exceptions, "NoArgsIsHelpError", ())  # click >= 8.2: a group called without a command
INPUT_ERRORS = (InputError, OpLibraryMissing)  # the library's errors about the user's inputs and setup
_ALLOCATOR_FAILURE = "DefaultCPUAllocator: can't allocate memory"  # torch's RuntimeError when an allocation fails

# Pruning options each policy ignores: the PruneSpec fields the others read (raggedvit.policies.POLICY_PARAMS), all
# of them and prune_at for "none"; fuse with another policy than evit gets PruneSpec's own, more specific error.
_PRUNE_OPTIONS = tuple(dict.fromkeys(name for p in REGISTRY.values() for name in p.params))
IGNORED_BY_POLICY = {
    name: tuple(o for o in _PRUNE_OPTIONS if o not in p.params and o != "fuse")
    if p.prunes
    else ("prune_at", *_PRUNE_OPTIONS)
    for name, p in REGISTRY.items()
}


def weight_source_options(command: Callable) -> Callable:
    """The weight-source options of every command that builds a model: --checkpoint, --pretrained, --seed (at most
    one of them: check_weight_source)."""
    options = [
        click.option(
            "--checkpoint", type=click.Path(path_type=Path), default=None, help="State dict (.pth/.safetensors)."
        ),
        click.option("--pretrained", is_flag=True, default=False, help="timm's pretrained weights (needs network)."),
        click.option("--seed", type=int, default=None, help="Seeded random weights (default 0 without other weights)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def check_image_folder(image_dir: Path | str | None) -> None:
    """CliError unless --images (when given) names a folder: a file, or nothing there, is named as such."""
    if image_dir is None or Path(image_dir).is_dir():
        return
    if Path(image_dir).exists():
        raise CliError(f"--images {str(image_dir)!r} is a file, not a folder: give the folder that holds the images")
    raise CliError(f"image directory {str(image_dir)!r} does not exist")


def check_weight_source(checkpoint: Path | None, pretrained: bool, seed: int | None) -> None:
    """CliError for more than one weight source, or a checkpoint that cannot be read."""
    if sum([checkpoint is not None, pretrained, seed is not None]) > 1:
        raise CliError("give at most one of --checkpoint, --pretrained, --seed")
    if checkpoint is not None:
        check_readable_file(Path(checkpoint), "checkpoint")


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
    if isinstance(exc, (Interrupted, KeyboardInterrupt, click.Abort)):
        by = f" by {exc.signal_name}" if isinstance(exc, Interrupted) else ""
        kept = getattr(exc, "kept", None)  # resumable progress (raggedvit.outputs.undo_on_interrupt)
        left = f"kept {', '.join(str(p) for p in kept)} to resume from" if kept else "nothing it wrote is left"
        return 130, f"interrupted{by}; {left}"
    if isinstance(exc, INPUT_ERRORS):
        return 2, _one_line(str(exc))
    if isinstance(exc, MemoryError):
        return 2, "out of memory" + (
            f": {_one_line(str(exc))}" if str(exc) else " (are the sizes asked for too large?)"
        )
    if isinstance(exc, RuntimeError) and _ALLOCATOR_FAILURE in str(exc):  # torch's CPU allocator
        return 2, "out of memory: " + _one_line(str(exc).split(_ALLOCATOR_FAILURE, 1)[1]).lstrip(": ")
    if isinstance(exc, OSError) and exc.strerror:
        where = f" {str(exc.filename)!r}" if exc.filename else ""
        return 2, f"cannot access{where}: {exc.strerror}"
    first = str(exc).splitlines()[0] if str(exc).strip() else ""
    return 3, f"internal error: {type(exc).__name__}: {first}"


def check_writable(path: Path, what: str) -> None:
    """CliError unless `path` can be created or replaced: a name the file system takes, a regular file (or nothing)
    in a folder that takes a new entry now (tried: raggedvit.outputs.check_target), with no symlink loop on the way.
    Called before any work, so a bad output fails in a moment, not after an export."""
    limit = name_max(path.parent if path.parent.is_dir() else Path("."))
    size = len(os.fsencode(path.name))
    if size > limit:
        raise CliError(
            f"cannot write {what} {str(path)!r}: its name is {size} bytes and this file system takes at most {limit}; "
            "choose a shorter name"
        )
    try:
        parent = path.resolve().parent
        if path.is_symlink():
            path.stat()  # a dangling link is fine (FileNotFoundError), a looping one is not
    except FileNotFoundError:
        pass
    except (RuntimeError, OSError) as e:  # pathlib raises RuntimeError("Symlink loop ...") before Python 3.13
        if isinstance(e, OSError) and e.errno != errno.ELOOP:
            raise CliError(f"cannot write {what} {str(path)!r}: {e.strerror or e}") from None
        raise CliError(f"cannot write {what} {str(path)!r}: a symlink loop in its path") from None
    if path.is_dir():
        raise CliError(f"{what} {str(path)!r} is a directory")
    if path.exists() and not path.is_file():  # a device or a fifo: replacing it would be a surprise
        raise CliError(f"{what} {str(path)!r} exists and is not a regular file")
    if not parent.is_dir():
        raise CliError(f"cannot write {what} {str(path)!r}: directory {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK):
        raise CliError(f"cannot write {what} {str(path)!r}: directory {str(parent)!r} is not writable")
    try:
        check_target(path)  # os.access says yes to root on read-only mounts and in /proc
    except OSError as e:
        raise CliError(
            f"cannot write {what} {str(path)!r}: directory {str(parent)!r} takes no new file ({e.strerror}); "
            "choose another folder"
        ) from None


def check_readable_file(path: Path, what: str) -> None:
    """CliError unless `path` is a regular file (through links) that exists: says which of missing, a directory,
    a symlink loop or something else it is."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise CliError(f"{what} {str(path)!r} does not exist") from None
        if e.errno == errno.ELOOP:
            raise CliError(f"{what} {str(path)!r} is a symlink loop") from None
        raise CliError(f"cannot read {what} {str(path)!r}: {e.strerror or e}") from None
    if stat.S_ISDIR(mode):
        raise CliError(f"{what} {str(path)!r} is a directory, not a file")
    if not stat.S_ISREG(mode):
        raise CliError(f"{what} {str(path)!r} is not a regular file")


def check_folder(path: Path, what: str) -> None:
    """CliError when `path` exists (or is a link) but is not a folder one can enter: a file, a symlink loop."""
    if not os.path.lexists(path) or path.is_dir():
        return
    try:
        os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise CliError(f"{what} {str(path)!r} is a symlink loop") from None
        if e.errno == errno.ENOENT:
            raise CliError(f"{what} {str(path)!r} is a link to nothing") from None
    raise CliError(f"{what} {str(path)!r} exists and is not a directory")


def parse_int_list(option: str, text: str, *, lo: int, what: str) -> tuple[int, ...]:
    """The comma-separated integers of `text`, each >= lo; CliError for an empty list or item ("1,,2") or another
    value. `what` names the items in the message ("positive integers", "block indices >= 1")."""
    parts = text.split(",")
    try:
        values = tuple(int(p.strip()) for p in parts)
    except ValueError:
        values = ()
    if not values or min(values) < lo:
        raise CliError(f"{option} must be comma-separated {what}, got {text!r}")
    return values


def check_img_size(model: str, vit, img_size: int | None) -> None:
    """CliError, before any tracing, when --img-size leaves `vit` (timm, built at that size) no whole patch: the
    smallest valid size is its patch size."""
    patch = getattr(getattr(vit, "patch_embed", None), "patch_size", None)
    if img_size is None or patch is None:
        return
    smallest = max(int(p) for p in (patch if isinstance(patch, (tuple, list)) else (patch, patch)))
    if img_size < smallest:
        raise CliError(
            f"--img-size {img_size} is too small for {model}: the smallest valid size is {smallest} (its patch size)"
        )


def refuse_unused_checkpoint(recipe: dict, checkpoint: Path | None, onnx_name: str) -> None:
    """CliError when --checkpoint is given for an export whose weights did not come from a checkpoint."""
    source = (recipe.get("weights") or {}).get("source")
    if checkpoint is not None and source != "checkpoint":
        raise CliError(
            f"--checkpoint does not apply: {onnx_name} was exported with {source or 'unrecorded'} weights; leave it out"
        )


def load_model(model: str, **kwargs):
    """raggedvit.weights.load_vit with its failures turned into one-line CliErrors."""
    import pickle

    from raggedvit.weights import load_vit

    try:
        return load_vit(model, **kwargs)
    except ValueError as e:
        raise CliError(str(e)) from None
    except (RuntimeError, OSError, pickle.UnpicklingError, EOFError) as e:
        ckpt = kwargs.get("checkpoint")
        if ckpt is not None:
            raise CliError(f"cannot read checkpoint {str(ckpt)!r}: {str(e).splitlines()[0]}") from None
        raise CliError(f"cannot build {model}: {str(e).splitlines()[0]}") from None
    except Exception as e:  # safetensors raises its own error type
        if kwargs.get("checkpoint") is not None and "safetensor" in type(e).__name__.lower():
            raise CliError(f"cannot read checkpoint {str(kwargs['checkpoint'])!r}: {e}") from None
        raise


@contextlib.contextmanager
def quiet_numerics() -> Iterator[None]:
    """No numpy / torch RuntimeWarnings (NaN or Inf in a comparison): the command reports them in its verdict."""
    import numpy as np

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


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


def note_policy_state(model, spec) -> None:
    """One 'note:' line on stderr when the checkpoint carried a learned policy's weights (DynamicViT's predictor)
    that `spec`'s policy does not use: the backbone is loaded, the predictor ignored."""
    from raggedvit.pruning.factory import ignored_policy_state

    ignored = ignored_policy_state(model, spec)
    if ignored:
        learned = ", ".join(p.name for p in REGISTRY.values() if p.learned)
        click.echo(
            f"note: the checkpoint's {learned} predictor ({len(ignored)} keys: {ignored[0]}, ...) is ignored by "
            f"--policy {spec.policy}; its backbone is loaded",
            err=True,
        )


def warn_nonfinite(model) -> None:
    """One 'warning:' line on stderr when the model's weights hold NaN or Inf (the export would not be finite)."""
    from raggedvit.weights import nonfinite_tensors

    bad = nonfinite_tensors(model)
    if bad:
        names = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more weight tensors" if len(bad) > 3 else "")
        click.echo(f"warning: NaN or Inf values in {names}: the exported model will not give finite outputs", err=True)


def require_onnxruntime_cli() -> None:
    """CliError (exit 2) naming the install command when `import onnxruntime` fails."""
    from raggedvit.cli.ort_dist import OnnxRuntimeMissing, require_onnxruntime

    try:
        require_onnxruntime()
    except OnnxRuntimeMissing as e:
        raise CliError(str(e)) from None
    import onnxruntime

    onnxruntime.set_default_logger_severity(3)  # errors only: ORT's start-up warnings are not the command's output
