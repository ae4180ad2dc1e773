"""run_sweep: every point measured in turn, each written as soon as it is done, so a resumed run skips it."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from raggedvit.outputs import held_folder, raise_pending_interrupt
from raggedvit.pruning import PolicyStateError, PruneSpec, build_pruned_vit
from raggedvit.pruning.backbone import Backbone
from raggedvit.pruning.families import backbone_for
from raggedvit.pruning.packed import backbone_refusal
from raggedvit.pruning.precision import DTYPES
from raggedvit.sweep.grid import SweepInputError, equal_points, point_key, point_label, point_params
from raggedvit.sweep.inputs import SweepImages, sweep_images
from raggedvit.sweep.measure import measure_accuracy, measure_speed, reference
from raggedvit.sweep.progress import Progress
from raggedvit.sweep.report import FILES, PointResult, SweepResult
from raggedvit.timing import cpu_name
from raggedvit.weights import WeightsInfo

__all__ = ["DTYPES", "check_out_folder", "default_dtype", "run_sweep", "write_outputs"]

_OOM_TEXT = ("out of memory", "can't allocate memory", "failed to allocate memory")


def default_dtype(device: str) -> str:
    """The export dtype of a sweep: fp16-all on CUDA (the fastest), fp32 on the CPU (the CPU EP has no fp16 GEMMs)."""
    return "fp16-all" if device == "cuda" else "fp32"


def run_sweep(
    vit: torch.nn.Module,
    weights: WeightsInfo,
    points: Sequence[PruneSpec],
    *,
    images: str | Path | None = None,
    labels: str | Path | None = None,
    device: str = "cpu",
    batch: int = 32,
    dtype: str | None = None,
    capacity: bool = False,
    seconds: float = 0.5,
    out: str | Path | None = None,
    resume: bool = False,
    progress: bool = False,
) -> SweepResult:
    """Measure the unpruned model (policy none, always first) and every point of `points` on `vit`.

    vit, weights: raggedvit.weights.load_vit's model and WeightsInfo. points: PruneSpecs (grid_points). images: a
    folder (ImageNet-style class folders give top-1 / top-5; `labels` maps their names to class indices), None for
    the sample photos. device: where PyTorch and ONNX Runtime run. batch: the batch timed (and PyTorch's batch).
    dtype: the export dtype (default_dtype). capacity: export in the capacity layout (every policy static-shape).
    seconds: timed seconds per point. out: a folder for sweep.json / .csv / .md / .png, rewritten after every point
    and held for the run (a second run into it is refused); resume: keep the points a previous run with the same
    settings finished there, those this grid no longer lists included. progress: the count of points, then a line
    per point with the time left, on stderr (a bar on a terminal).

    A point equal to an earlier one (tome r past half the tokens: equal_points) is not measured again: its result
    is the earlier one's, with `same_as` naming it. SweepInputError (one line) for unusable input, before the first
    point for every problem of the points themselves; an interrupt loses only the point in progress."""
    dtype = dtype or default_dtype(device)
    _check_args(device, batch, dtype, seconds, out, resume)
    try:
        backbone = backbone_for(vit)
    except ValueError as e:
        raise SweepInputError(f"unsupported model {weights.model_name}: {e}") from None
    if int(getattr(vit, "num_classes", 0) or 0) == 0:
        raise SweepInputError(f"{weights.model_name} has no classifier head (num_classes=0): a sweep compares classes")
    specs = _points(points, backbone, weights.model_name)
    _check_batch_fits(backbone, batch, device)
    imgs = sweep_images(vit, images, labels)
    settings = _settings(weights, backbone, imgs.describe(), device, batch, dtype, capacity, seconds)
    out_dir = Path(out) if out is not None else None
    with contextlib.nullcontext() if out_dir is None else _held(out_dir):
        done = _finished(out_dir, settings) if resume and out_dir is not None else {}
        result, todo = _plan(settings, specs, done, backbone)
        if out_dir is not None and not todo:
            write_outputs(result, out_dir)
            return result
        bar = Progress(len(todo), enabled=progress)
        try:
            bar.note(_count(specs, todo, done))
            _measure(vit, weights, backbone, specs, todo, result, bar, imgs=imgs, device=device, batch=batch,
                     dtype=dtype, capacity=capacity, seconds=seconds, out=out_dir)  # fmt: skip
        finally:
            bar.close()
    return result


def _plan(
    settings: dict[str, Any], specs: list[PruneSpec], done: dict[str, PointResult], backbone: Backbone
) -> tuple[SweepResult, list[tuple[PruneSpec, list[PruneSpec]]]]:
    """The result so far (the finished points of `done`, those the grid no longer lists included, and the points
    equal to a finished one) and what is left: (the point to measure, the points equal to it), in the grid's order."""
    listed = {point_key(s) for s in specs}
    kept = [PruneSpec.from_dict(p.spec) for p in done.values() if p.key not in listed]
    every = [*specs, *kept]
    same = equal_points(every, depth=backbone.depth, tokens=backbone.tokens_per_image(), num_prefix=backbone.num_prefix)
    groups: dict[str, list[PruneSpec]] = {}  # the first point of each model -> every point of that model
    for spec in every:
        groups.setdefault(same.get(point_key(spec), point_key(spec)), []).append(spec)
    points, todo = [], []
    for members in groups.values():
        found = [done[point_key(s)] for s in members if point_key(s) in done]
        points += found
        source = next((p for p in found if p.same_as is None), None)
        rest = [s for s in members if point_key(s) not in done]
        if source is not None:
            points += [_copy(source, s) for s in rest]
        elif rest:
            todo.append((rest[0], rest[1:]))
    result = SweepResult(settings)
    result.points = _in_order(every, points)
    return result, todo


def _count(specs: list[PruneSpec], todo: list, done: dict[str, PointResult]) -> str:
    """The line before the first point: how many points, how many to measure, and why the others are not."""
    equal = len(specs) - len(todo) - sum(point_key(s) in done for s in specs)
    parts = [f"{len(todo)} to measure"]
    if equal:
        parts.append(f"{equal} equal to another point, not measured again")
    if done:
        parts.append(f"{len(done)} finished before, kept")
    return f"{len(specs)} points (the unpruned model and the grid's {len(specs) - 1}): {', '.join(parts)}"


def _measure(
    vit: torch.nn.Module,
    weights: WeightsInfo,
    backbone: Backbone,
    specs: list[PruneSpec],
    todo: list[tuple[PruneSpec, list[PruneSpec]]],
    result: SweepResult,
    bar: Progress,
    *,
    imgs: SweepImages,
    device: str,
    batch: int,
    dtype: str,
    capacity: bool,
    seconds: float,
    out: Path | None,
) -> None:
    """Measure each point of `todo` in turn, adding it (and the points equal to it) to `result`, written to `out`
    after each."""
    recipe = {"model": weights.model_name, "weights": weights.to_dict()}
    with _workdir(out) as work, _out_of_memory(batch, device):
        if device == "cuda":
            from raggedvit.timing import start_cupti

            start_cupti()  # before any CUDA graph: the GPU time of their replays is seen
        model = vit if device == "cpu" else copy.deepcopy(vit).to(device)
        ref = reference(model, imgs, batch=batch, device=device)
        inputs = next(imgs.batches(vit, batch))[1]  # the first images, tiled to the batch for timing
        for spec, equal in todo:
            bar.start(point_label(spec))
            start = time.perf_counter()
            acc = measure_accuracy(model, backbone, spec, imgs, ref, batch=batch, device=device)
            speed = measure_speed(vit, spec, inputs, work, recipe=recipe, dtype=dtype, capacity=capacity,
                                  device=device, batch=batch, seconds=seconds)  # fmt: skip
            took = time.perf_counter() - start
            point = PointResult(**_names(spec), **acc, **speed, seconds=round(took, 3))
            result.points = _in_order(specs, [*result.points, point, *(_copy(point, s) for s in equal)])
            if out is not None:
                write_outputs(result, out)
            bar.finished(point_label(spec), took)
            raise_pending_interrupt()  # a Ctrl-C whose exception was lost during the point


def _names(spec: PruneSpec) -> dict[str, Any]:
    """The fields of a PointResult that say which point it is."""
    return {"key": point_key(spec), "label": point_label(spec), "policy": spec.policy, "params": point_params(spec),
            "spec": spec.to_dict()}  # fmt: skip


def _copy(point: PointResult, spec: PruneSpec) -> PointResult:
    """`point`'s result as the result of `spec`, a point equal to it (not measured: seconds 0)."""
    return dataclasses.replace(point, **_names(spec), seconds=0.0, same_as=point.key)


def write_outputs(result: SweepResult, out: Path) -> list[Path]:
    """sweep.json, sweep.csv, sweep.md and sweep.png in `out`, atomically as a set; resumable: an interrupted
    command keeps them (--resume starts from them)."""
    import json

    from raggedvit.outputs import atomic_write_all
    from raggedvit.sweep.plot import plot_png

    data = [json.dumps(result.to_dict(), indent=1) + "\n", result.to_csv(), result.to_markdown(), plot_png(result)]
    return atomic_write_all({out / name: d for name, d in zip(FILES, data)}, resumable=True)


def _check_args(device: str, batch: int, dtype: str, seconds: float, out, resume: bool) -> None:
    if device not in ("cpu", "cuda"):
        raise SweepInputError(f"device must be cpu or cuda, got {device!r}")
    if batch < 1:
        raise SweepInputError(f"--batch must be positive, got {batch}")
    if dtype not in DTYPES:
        raise SweepInputError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if not (seconds > 0 and seconds < float("inf")):
        raise SweepInputError(f"--seconds must be positive, got {seconds}")
    if resume and out is None:
        raise SweepInputError("--resume needs the folder of the run to resume (--out)")
    if out is not None:
        check_out_folder(out)
    if device == "cuda":
        import onnxruntime as ort

        if not torch.cuda.is_available():
            raise SweepInputError("--device cuda: torch sees no CUDA GPU on this machine")
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise SweepInputError(f"--device cuda: onnxruntime {ort.__version__} has no CUDAExecutionProvider")


def check_out_folder(out: str | Path) -> None:
    """SweepInputError unless `out` names a folder that is (or can be made) writable, and matplotlib (sweep.png) is
    there: an empty name (an unset shell variable) is refused, not taken for the current folder."""
    import importlib.util

    if isinstance(out, str) and not out.strip():
        raise SweepInputError(f"--out is empty ({out!r}): name the folder of the sweep's files")
    if importlib.util.find_spec("matplotlib") is None:  # before the first point, not after it
        raise SweepInputError("sweep.png needs matplotlib: pip install 'raggedvit[images]' (or matplotlib)")
    out = Path(out)
    probe = out
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe == out and not out.is_dir():
        raise SweepInputError(f"--out {str(out)!r} exists and is not a folder")
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise SweepInputError(f"--out {str(out)!r}: folder {str(probe)!r} is not writable")


def _points(points: Sequence[PruneSpec], backbone: Backbone, model: str) -> list[PruneSpec]:
    """The unpruned baseline, then `points` without repeats; SweepInputError for a point the model cannot run (a
    merging policy on a family without merging: export's message; a learned policy whose predictor the checkpoint
    lacks: the keys it misses), before any point is measured."""
    specs = [PruneSpec()]
    for spec in points:
        try:
            spec.check_model(depth=backbone.depth, has_class_token=backbone.has_class_token)
        except ValueError as e:
            raise SweepInputError(f"{point_label(spec)}: {e}") from None
        refusal = backbone_refusal(spec, backbone)
        if refusal:
            fuse = " --fuse" if spec.fuse else ""
            raise SweepInputError(f"--policy {spec.policy}{fuse} cannot run {model}: {refusal}")
        if spec.descriptor.learned:
            try:
                build_pruned_vit(backbone.model, spec)  # loads the checkpoint's predictor, or names what is missing
            except PolicyStateError as e:
                raise SweepInputError(f"{point_label(spec)}: {e}") from None
        if spec not in specs:
            specs.append(spec)
    return specs


def _in_order(specs: list[PruneSpec], points: list[PointResult]) -> list[PointResult]:
    """`points` in the order of `specs`; the points `specs` does not list (kept from an earlier run) after them, in
    their order."""
    order = {point_key(s): i for i, s in enumerate(specs)}
    return sorted(points, key=lambda p: order.get(p.key, len(order)))


class _held(held_folder):  # noqa: N801 - used as a function
    """`out` held for the run (raggedvit.outputs.held_folder: made if missing, removed again if nothing was written
    in it); SweepInputError when another sweep holds it."""

    def __enter__(self) -> Path:
        try:
            return super().__enter__()
        except BlockingIOError:
            raise SweepInputError(
                f"--out {str(self._folder)!r} is in use by another sweep; wait for it to end or choose another --out"
            ) from None


def _check_batch_fits(backbone: Backbone, batch: int, device: str) -> None:
    """SweepInputError when the batch's float32 images and largest activations (an MLP's hidden rows, a few live at
    once) exceed the device's memory: a lower bound of what the batch needs; a failed allocation later is reported
    the same way (_out_of_memory)."""
    model = backbone.model
    size = [int(s) for s in model.patch_embed.img_size]
    widest = max((m.out_features for m in model.modules() if isinstance(m, torch.nn.Linear)), default=0)
    need = batch * (3 * size[0] * size[1] + 4 * backbone.tokens_per_image() * widest) * 4
    if device == "cuda":
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    else:
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            return
    if need > total:
        raise SweepInputError(
            f"--batch {batch} does not fit the {device}: it needs at least {need / 2**30:.1f} GiB, the {device} has "
            f"{total / 2**30:.1f} GiB"
        )


@contextlib.contextmanager
def _out_of_memory(batch: int, device: str) -> Iterator[None]:
    """A failed allocation (PyTorch or ONNX Runtime) as SweepInputError: the batch does not fit the device."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - ONNX Runtime's errors have no common type but Exception
        text = str(e)
        oom = isinstance(e, MemoryError) or any(t in text.lower() for t in _OOM_TEXT)
        if isinstance(e, SweepInputError) or not oom:
            raise
        first = " ".join(text.split())[:300] or type(e).__name__
        raise SweepInputError(f"--batch {batch} does not fit the {device}: {first}") from None


@contextlib.contextmanager
def _workdir(out: Path | None) -> Iterator[Path]:
    """A scratch folder for the exports, removed however the sweep ends: a staging folder in `out`, else a
    temporary one."""
    if out is None:
        with tempfile.TemporaryDirectory(prefix="raggedvit-sweep-") as tmp:
            yield Path(tmp)
        return
    from raggedvit.outputs import staging_dir

    with staging_dir(out, "sweep-exports") as tmp:
        yield tmp


def _finished(out: Path, settings: dict[str, Any]) -> dict[str, PointResult]:
    """The points of out/sweep.json by key, in its order, when its settings are these ({} without the file);
    SweepInputError when they differ (naming the first that differs, in the order of `settings`: the model first) or
    the file cannot be read."""
    path = out / FILES[0]
    if not path.exists():
        return {}
    try:
        prev = SweepResult.load(path)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SweepInputError(f"--resume: cannot read {str(path)!r} ({type(e).__name__}: {e}); start afresh") from None
    for key in [*settings, *(k for k in prev.settings if k not in settings)]:
        if prev.settings.get(key) != settings.get(key):
            raise SweepInputError(
                f"--resume: {str(path)!r} was made with other settings ({key}: {prev.settings.get(key)!r}, now "
                f"{settings.get(key)!r}); use another --out or leave --resume out to start afresh"
            )
    return {p.key: p for p in prev.points}


def _settings(
    weights: WeightsInfo,
    backbone: Backbone,
    images: dict[str, Any],
    device: str,
    batch: int,
    dtype: str,
    capacity: bool,
    seconds: float,
) -> dict[str, Any]:
    """What was swept and how: a resumed run must match every field."""
    import importlib.metadata as md

    import onnxruntime as ort

    import raggedvit

    return {
        "model": weights.model_name,
        "weights": weights.to_dict(),
        "depth": backbone.depth,
        "device": device,
        "device_name": _device_name(device),
        "batch": batch,
        "dtype": dtype,
        "capacity": capacity,
        "seconds": seconds,
        "images": images,
        "versions": {
            "raggedvit": raggedvit.__version__,
            "torch": torch.__version__,
            "onnxruntime": ort.__version__,
            "timm": md.version("timm"),
        },
    }


def _device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name(torch.cuda.current_device())
    return cpu_name()
