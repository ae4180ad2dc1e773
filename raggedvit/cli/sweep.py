"""The `raggedvit sweep` command: accuracy against speed over grids of pruning settings, thin over
raggedvit.sweep.run_sweep. Same contract as every command: the library's InputErrors (SweepInputError among them)
exit 2 through cli/contract.py's one mapping."""

from __future__ import annotations

from pathlib import Path

import click

from raggedvit.cli.contract import (
    EXPORT_DTYPES,
    CliError,
    check_folder,
    check_image_folder,
    check_img_size,
    check_range,
    check_readable_file,
    check_weight_source,
    load_model,
    require_device,
    require_onnxruntime_cli,
    weight_source_options,
)
from raggedvit.policies import REGISTRY

__all__ = ["sweep"]


@click.command()
@click.argument("model")
@weight_source_options
@click.option("--img-size", type=int, default=None, help="Input resolution (default: the model's).")
@click.option(
    "--policy",
    "policies",
    multiple=True,
    type=click.Choice([name for name, p in REGISTRY.items() if p.prunes]),
    help="A policy to sweep, with its --grid (repeat both for more policies; the unpruned model is always measured).",
)
@click.option(
    "--grid",
    "grids",
    multiple=True,
    help='The points of the --policy before it: KEY=VALUES separated by spaces, e.g. "keep=0.3,0.5,0.7 at=3,6,9|4" '
    "(keys: the policy's options; at: --prune-at alternatives separated by |). Every combination is a point.",
)
@click.option(
    "--images",
    "image_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Folder of images, or of class folders (DIR/<class>/<image>) for top-1 / top-5 accuracy.",
)
@click.option(
    "--labels",
    type=click.Path(path_type=Path),
    default=None,
    help="Class folder names in class-index order, one per line (default: folder names that are class indices or "
    "synsets of the model's classes).",
)
@click.option("--sample-images", is_flag=True, default=False, help="Bundled sample photos (the default source).")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", help="Where PyTorch and ORT run.")
@click.option("--batch", type=int, default=32, help="Batch size timed in ONNX Runtime (and PyTorch's batch).")
@click.option(
    "--dtype",
    type=click.Choice(EXPORT_DTYPES),
    default=None,
    show_default="fp16-all on cuda, fp32 on cpu",
    help="Export dtype of the timed models.",
)
@click.option(
    "--capacity", is_flag=True, default=False, help="Export in the capacity layout (every policy as a CUDA graph)."
)
@click.option("--seconds", type=float, default=0.5, help="Timed seconds per point (median reported).")
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default="sweep",
    help="Folder of sweep.json, sweep.csv, sweep.md and sweep.png (rewritten after every point; one sweep at a time).",
)
@click.option(
    "--resume",
    is_flag=True,
    default=False,
    help="Keep the points a run with the same settings finished there (also those this grid does not list).",
)
def sweep(
    model: str,
    checkpoint: Path | None,
    pretrained: bool,
    seed: int | None,
    img_size: int | None,
    policies: tuple[str, ...],
    grids: tuple[str, ...],
    image_dir: Path | None,
    labels: Path | None,
    sample_images: bool,
    device: str,
    batch: int,
    dtype: str | None,
    capacity: bool,
    seconds: float,
    out: str,
    resume: bool,
) -> None:
    """Accuracy against speed of MODEL over grids of pruning settings: one table, one chart (in --out).

    Each point: PrunedViT in PyTorch against the unpruned model (agreement, top-1/top-5 with class folders, KL,
    tokens, FLOPs) and its export timed in ONNX Runtime (img/s at --batch, GPU time on cuda)."""
    check_weight_source(checkpoint, pretrained, seed)
    if image_dir is not None and sample_images:
        raise CliError("give at most one of --images, --sample-images")
    if not policies:
        raise CliError('give at least one --policy with its --grid, e.g. --policy topk-l2 --grid "keep=0.5,0.7 at=4"')
    if len(policies) != len(grids):
        raise CliError(f"give one --grid per --policy (got {len(policies)} --policy and {len(grids)} --grid)")
    if batch <= 0:
        raise CliError(f"--batch must be positive, got {batch}")
    if img_size is not None and img_size <= 0:
        raise CliError(f"--img-size must be positive, got {img_size}")
    check_range("--seconds", seconds, 0.0, lo_open=True)
    if labels is not None:
        check_readable_file(Path(labels), "labels file")
    check_image_folder(image_dir)
    check_folder(Path(out), "--out")
    require_onnxruntime_cli()
    require_device(device)
    from raggedvit.sweep import FILES, check_out_folder, grid_points, run_sweep

    check_out_folder(out)  # InputError: 2 ("" is refused, not the current folder)
    points = [spec for policy, grid in zip(policies, grids) for spec in grid_points(policy, grid)]  # InputError: 2
    vit, info = load_model(model, checkpoint=checkpoint, pretrained=pretrained, seed=seed, img_size=img_size)
    check_img_size(model, vit, img_size)
    result = run_sweep(
        vit,
        info,
        points,
        images=image_dir,
        labels=labels,
        device=device,
        batch=batch,
        dtype=dtype,
        capacity=capacity,
        seconds=seconds,
        out=out,
        resume=resume,
        progress=True,
    )
    click.echo(result.to_markdown(), nl=False)
    click.echo(f"wrote {', '.join(str(Path(out) / name) for name in FILES)}", err=True)
