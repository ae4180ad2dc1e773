"""The click group of the raggedvit command line and its core commands: export | validate | info (thin click
commands over the library; raggedvit.cli adds the tool commands of raggedvit.cli.tools).

Exit codes (one mapping for every command: raggedvit.cli.contract.exit_status): 0 success / validation
passed, 1 validation failed numerically, 2 usage or input error (one line "error: ..." on stderr, no partial
output file), 130 interrupted (SIGINT or SIGTERM; temp files and outputs already in place removed: nothing is
left), 3 unexpected internal error (set RAGGEDVIT_DEBUG=1 for the traceback).
"""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import click

from raggedvit.cli.contract import (
    EXPORT_DTYPES,
    CliError,
    check_image_folder,
    check_img_size,
    check_memory,
    check_range,
    check_readable_file,
    check_weight_source,
    check_writable,
    exit_status,
    interrupts_raise,
    load_model,
    note_policy_state,
    parse_int_list,
    quiet_numerics,
    refuse_ignored_options,
    refuse_unused_checkpoint,
    require_onnxruntime_cli,
    warn_nonfinite,
    weight_source_options,
)
from raggedvit.outputs import undo_on_interrupt
from raggedvit.policies import POLICIES, get_policy

__all__ = ["main"]

POLICY_CHOICES = POLICIES  # torch-free (raggedvit.policies)


class _Group(click.Group):
    """A click group whose every ending goes through exit_status: one "error: ..." line and its exit code."""

    def main(self, args=None, prog_name=None, **kwargs):  # type: ignore[override]
        restore = interrupts_raise()
        guard = undo_on_interrupt(also=(click.Abort,))  # click turns a KeyboardInterrupt into Abort
        try:
            with guard:
                rv = super().main(args=args, prog_name=prog_name or "raggedvit", standalone_mode=False, **kwargs)
        except click.exceptions.Exit as e:
            sys.exit(e.exit_code)
        except SystemExit:
            raise
        except BaseException as e:  # noqa: BLE001 - the one error contract of every command
            guard.undo(e)  # again: a signal that landed as the block's exit began, or after it
            code, message = exit_status(e)
            if code == 3 and os.environ.get("RAGGEDVIT_DEBUG"):
                raise
            click.echo(f"error: {message}", err=True)
            if code == 130:  # ends at once: Python's last collection of every object (seconds with torch) is skipped
                gc.freeze()
            sys.exit(code)
        finally:
            restore()
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.version_option(package_name="raggedvit")
def main() -> None:
    """Export token-pruned timm ViTs to ONNX (com.raggedvit::RaggedAttention) and validate them."""


# ---- export ---------------------------------------------------------------------------------------
@main.command()
@click.argument("model")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path), help="ONNX file.")
@weight_source_options
@click.option("--img-size", type=int, default=None, help="Input resolution (default: the model's).")
@click.option("--policy", type=click.Choice(POLICY_CHOICES), default="topk-l2", help="Token pruning policy.")
@click.option(
    "--keep",
    type=float,
    default=None,
    help="Fraction of patch tokens kept per stage: ceil(keep * patches) (topk-l2, default 0.5; evit, default 0.7); "
    "dynamicvit: its rho, int(P * rho^(s+1)) at stage s (default 0.7).",
)
@click.option("--mass", type=float, default=None, help="Cumulative cls-attention mass kept per stage (cls-mass, 0.9).")
@click.option(
    "--prune-at",
    default=None,
    help="Comma-separated block indices of the stages. topk-l2, cls-mass (default 4) and dynamicvit (default 3,6,9): "
    "a stage before block i. evit (default 3,6,9, EViT's drop_loc): inside block i, after its attention, so evit's "
    "i is the i+1 of the others. tome: the blocks that merge (default every block).",
)
@click.option(
    "--fuse", is_flag=True, default=False, help="evit: one extra token, the attention-weighted sum of the dropped."
)
@click.option("--r", "r", type=int, default=None, help="tome: tokens merged per block and image (default 8).")
@click.option(
    "--dtype",
    type=click.Choice(EXPORT_DTYPES),
    default="fp32",
    help="fp32; fp16: fp16 GEMMs/attention, float32 residual stream and LayerNorms; fp16-all: the stream too.",
)
@click.option(
    "--diagnostics",
    is_flag=True,
    default=False,
    help="Also output each stage's kept token indices and cu_seqlens (token_index_S, cu_seqlens_S).",
)
@click.option(
    "--capacity",
    is_flag=True,
    default=False,
    help="Capacity layout: each stage keeps a static row count (dead rows past cu_seqlens[B]), so every policy "
    "has static shapes and runs as a CUDA graph (GraphRunner, bench --cuda-graph).",
)
@click.option(
    "--ragged-linear",
    is_flag=True,
    default=False,
    help="Block GEMMs as com.raggedvit::RaggedLinear (fused bias / GELU / residual, dead rows of the capacity "
    "layout skipped); needs --dtype fp16 or fp16-all and K, N multiples of 16.",
)
@click.option(
    "--ragged-linear-blocks",
    type=click.Choice(["all", "dead-rows"]),
    default="all",
    show_default=True,
    help="With --ragged-linear: every block, or only the blocks whose rows include dead rows (--capacity after a "
    "cls-mass stage); the other blocks keep MatMul, which is faster on full rows.",
)
def export(
    model,
    output,
    checkpoint,
    pretrained,
    seed,
    img_size,
    policy,
    keep,
    mass,
    prune_at,
    fuse,
    r,
    dtype,
    diagnostics,
    capacity,
    ragged_linear,
    ragged_linear_blocks,
) -> None:
    """Export MODEL (a timm ViT name) with token pruning to an ONNX file."""
    from tqdm import tqdm

    refuse_ignored_options(click.get_current_context(), policy)
    check_weight_source(checkpoint, pretrained, seed)
    if img_size is not None and img_size <= 0:
        raise CliError(f"--img-size must be positive, got {img_size}")
    check_writable(output, "output")
    from raggedvit.pruning import PruneSpec

    desc = get_policy(policy)
    prune_at = desc.default_at if prune_at is None else prune_at
    keep, mass, r = (v if v is not None or k not in desc.params else desc.default(k)
                     for k, v in (("keep", keep), ("mass", mass), ("r", r)))  # fmt: skip
    indices = ()
    if desc.prunes and prune_at != "every":
        indices = parse_int_list("--prune-at", prune_at, lo=0, what="block indices")
    try:
        spec = PruneSpec.from_strings(
            policy, indices, 0.5 if keep is None else keep, 0.9 if mass is None else mass, fuse, r=r or 0
        )
    except ValueError as e:
        raise CliError(f"bad pruning parameters: {e}") from None

    steps = tqdm(total=3, desc="export", unit="step", file=sys.stderr, disable=None, leave=False)
    steps.set_postfix_str("loading weights")
    vit, info = load_model(model, checkpoint=checkpoint, pretrained=pretrained, seed=seed, img_size=img_size)
    check_img_size(model, vit, img_size)
    warn_nonfinite(vit)
    steps.update()
    from raggedvit.exporter import export_onnx
    from raggedvit.pruning.families import backbone_for
    from raggedvit.pruning.packed import backbone_refusal

    try:
        backbone = backbone_for(vit)
    except ValueError as e:
        raise CliError(f"unsupported model {model}: {e}") from None
    try:
        spec.check_model(depth=backbone.depth, has_class_token=backbone.has_class_token)
    except ValueError as e:
        raise CliError(f"bad pruning parameters for {model}: {e}") from None
    refusal = backbone_refusal(spec, backbone)
    if refusal:
        raise CliError(f"--policy {spec.policy}{' --fuse' if spec.fuse else ''} cannot run {model}: {refusal}")
    note_policy_state(vit, spec)
    blocks_source = click.get_current_context().get_parameter_source("ragged_linear_blocks")
    if not ragged_linear and blocks_source not in (click.core.ParameterSource.DEFAULT, None):
        raise CliError("--ragged-linear-blocks applies with --ragged-linear only; add it or leave this out")
    if ragged_linear:
        from raggedvit.exporter.ragged_linear import check_ragged_linear

        try:
            check_ragged_linear(vit, dtype)
        except ValueError as e:
            raise CliError(f"--ragged-linear: {e}") from None
    weights = info.to_dict()  # the checkpoint's file name and sha256, never a local path
    if checkpoint is not None:  # and its path relative to the model's directory (validate looks there)
        from raggedvit.exporter.metadata import checkpoint_relpath

        weights["checkpoint_relpath"] = checkpoint_relpath(checkpoint, output)
    recipe = {"model": model, "weights": weights}
    steps.set_postfix_str("building graph")
    try:
        path = export_onnx(
            vit,
            spec,
            output,
            dtype=dtype,
            recipe=recipe,
            diagnostics=diagnostics,
            capacity=capacity,
            ragged_linear=ragged_linear_blocks if ragged_linear else False,
        )
    except OSError as e:
        raise CliError(f"cannot write output {str(output)!r}: {e.strerror or e}") from None
    steps.update(2)
    steps.close()
    from raggedvit.exporter.files import model_files

    files = model_files(path)  # the .onnx and, over 1 GiB of weights, its data file
    size_mb = sum(f.stat().st_size for f in files) / 2**20
    from raggedvit.exporter.checks import static_shapes

    shapes = (
        "static shapes: CUDA-graph capturable (GraphRunner, bench --cuda-graph)"
        if static_shapes(spec.to_dict(), capacity)
        else "data-dependent token counts: runs node by node (--capacity makes it capturable)"
    )
    written = " and ".join(str(f) for f in files)
    total = f"{size_mb:.1f} MiB{' in all' if len(files) > 1 else ''}"
    click.echo(f"wrote {written} ({model}, {spec.policy}, {dtype}, {total}; {shapes})")


# ---- validate -------------------------------------------------------------------------------------
@main.command()
@click.argument("onnx_file", metavar="MODEL.onnx", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--images", "image_dir", type=click.Path(path_type=Path), default=None, help="Folder of images.")
@click.option("--sample-images", is_flag=True, default=False, help="Bundled sample photos (the default source).")
@click.option("--random", "random_n", type=int, default=None, help="N seeded random normalised inputs.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", help="ONNX Runtime execution provider.")
@click.option(
    "--atol",
    type=float,
    default=None,
    show_default="by export dtype: fp32 4 x PyTorch's fp32-vs-float64 |Δlogit| + 1e-4, at most 0.004; fp16 0.004",
    help="Absolute part of the |Δlogit| bar; with RTOL 0, pass if max |Δlogit| < ATOL on every judged image.",
)
@click.option(
    "--rtol",
    type=float,
    default=None,
    show_default="by export dtype: fp32 0, fp16 and fp16-all 0.01",
    help="Relative part: pass if max |Δlogit| <= ATOL + RTOL x the image's max |reference logit| (0 = ATOL alone).",
)
@click.option("--min-top1", type=float, default=1.0, help="Pass if the top-1 agreement is at least this fraction.")
@click.option(
    "--tie-eps",
    type=float,
    default=1e-5,
    help="Relative score gap (or cls-mass margin / mass) at a cut below which an image is a near-tie (not judged). "
    "fp16 exports also excuse a cls-mass cut they moved within 4 fp16 ulps (relative): a precision tie.",
)
@click.option("--report", type=click.Path(path_type=Path), default=None, help="Write REPORT.json and REPORT.md.")
@click.option(
    "--checkpoint",
    type=click.Path(path_type=Path),
    default=None,
    help="Where the exported checkpoint is (default: its recorded place relative to MODEL.onnx, then the current "
    "directory; its sha256 must match).",
)
@click.option("--batch-size", type=int, default=16, help="Images per ORT / PyTorch call.")
@click.option(
    "--floor/--no-floor",
    default=None,
    help="Also report the precision floor of the export dtype: PyTorch with fp16-rounded weights, and PyTorch's own "
    "fp16 forward, against the fp32 reference (default: for fp16 exports). Does not change pass/fail.",
)
@click.option(
    "--block-k",
    type=float,
    default=None,
    show_default="3",
    help="Per-block rule: an image fails when a block's drift exceeds BLOCK_K x that block's precision floor "
    "+ BLOCK_ATOL.",
)
@click.option(
    "--block-atol", type=float, default=None, show_default="1e-5", help="Absolute part of the per-block rule."
)
@click.option(
    "--junit-xml",
    "junit",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write a JUnit XML file: one test case per image (the first failing block in its message) and one "
    "for the rule. The Markdown report is appended to $GITHUB_STEP_SUMMARY when that is set.",
)
def validate(
    onnx_file,
    image_dir,
    sample_images,
    random_n,
    device,
    atol,
    rtol,
    min_top1,
    tie_eps,
    report,
    checkpoint,
    batch_size,
    floor,
    block_k,
    block_atol,
    junit,
) -> int:
    """Run MODEL.onnx in ONNX Runtime and the PyTorch reference on the same images; print a Markdown report.

    Exit 0 if it passes, 1 on a numerical failure, 2 on a usage or input error.
    """
    require_onnxruntime_cli()
    if sum([image_dir is not None, sample_images, random_n is not None]) > 1:
        raise CliError("give at most one of --images, --sample-images, --random")
    check_image_folder(image_dir)
    if random_n is not None and random_n <= 0:
        raise CliError(f"--random must be positive, got {random_n}")
    if batch_size <= 0:
        raise CliError(f"--batch-size must be positive, got {batch_size}")
    if atol is not None:  # None: the export dtype's default rule
        check_range("--atol", atol, 0.0, lo_open=True)
    if rtol is not None:
        check_range("--rtol", rtol, 0.0)
    check_range("--min-top1", min_top1, 0.0, 1.0)
    check_range("--tie-eps", tie_eps, 0.0)
    if block_k is not None:
        check_range("--block-k", block_k, 0.0, lo_open=True)
    if block_atol is not None:
        check_range("--block-atol", block_atol, 0.0)
    if junit is not None:
        check_writable(junit, "JUnit XML")
    if report is not None:
        if not report.name:  # "" (an unset shell variable) or a folder such as "."
            raise CliError(f"--report {str(report)!r} names no file: give REPORT (REPORT.json and REPORT.md written)")
        base = report.with_suffix("") if report.suffix in (".json", ".md") else report
        check_writable(base.with_name(base.name + ".json"), "report")
    from raggedvit.validators.reference import load_recipe
    from raggedvit.validators.session import open_session

    recipe = load_recipe(onnx_file)
    refuse_unused_checkpoint(recipe, checkpoint, onnx_file.name)
    if checkpoint is not None:
        check_readable_file(Path(checkpoint), "checkpoint")
    if random_n is not None:  # the float32 images are made up front
        size = int(recipe.get("img_size") or 0)
        check_memory(f"--random {random_n}", random_n * 3 * size * size * 4)
    # fail fast (before torch is imported): op library, providers, model loads; then validated with this ORT session
    session = open_session(onnx_file, device, recipe=recipe)
    pairs = _decoded_images(image_dir)  # unreadable images fail before the reference is built
    from raggedvit.validators import Thresholds, load_reference
    from raggedvit.validators import validate as run_validation

    vit, spec = load_reference(recipe, checkpoint=checkpoint, model_path=onnx_file)
    images, names = _validation_images(vit, pairs, random_n)
    with quiet_numerics():  # NaN / Inf logits are the verdict's to report, not numpy's warnings
        result = run_validation(
            onnx_file,
            images,
            names,
            vit=vit,
            spec=spec,
            recipe=recipe,
            device=device,
            thresholds=Thresholds.for_dtype(
                str(recipe.get("dtype", "fp32")),
                atol=atol,
                rtol=rtol,
                min_top1=min_top1,
                tie_eps=tie_eps,
                block_k=block_k,
                block_atol=block_atol,
            ),
            batch_size=batch_size,
            progress=True,
            session=session,
            floor=floor,
        )
    click.echo(result.to_markdown(), nl=False)
    if report is not None:
        try:
            js, md = result.write(report)
        except OSError as e:
            raise CliError(f"cannot write report {str(report)!r}: {e.strerror or e}") from None
        click.echo(f"wrote {js} and {md}", err=True)
    from raggedvit.validators.junit import append_step_summary, write_junit

    if junit is not None:
        try:
            write_junit(result, junit)
        except OSError as e:
            raise CliError(f"cannot write JUnit XML {str(junit)!r}: {e.strerror or e}") from None
    try:
        append_step_summary(result)
    except OSError as e:
        raise CliError(f"cannot append to $GITHUB_STEP_SUMMARY: {e.strerror or e}") from None
    return 0 if result.passed else 1


def _decoded_images(image_dir: Path | None):
    """(name, RGB PIL image) pairs of --images (None without it); CliError on an unreadable image. What the folder
    holds besides images is listed in one warning line, with why each entry was skipped."""
    if image_dir is None:
        return None
    from raggedvit.images import load_image_dir, skipped_entries

    try:
        pairs = load_image_dir(image_dir)
    except ValueError as e:
        raise CliError(str(e)) from None
    skipped = skipped_entries(image_dir)
    if skipped:
        more = f" and {len(skipped) - 5} more" if len(skipped) > 5 else ""
        entries = f"{len(skipped)} {'entry' if len(skipped) == 1 else 'entries'}"
        click.echo(f"warning: --images {image_dir}: skipped {entries}: {'; '.join(skipped[:5])}{more}", err=True)
    return pairs


def _validation_images(vit, pairs, random_n: int | None):
    """(images [N, 3, S, S] float32, names) from decoded --images pairs, random seeded inputs, or the sample photos."""
    import torch

    from raggedvit.images import preprocess, sample_images
    from raggedvit.validators import ValidationInputError

    if random_n is not None:
        size = tuple(int(s) for s in vit.patch_embed.img_size)
        gen = torch.Generator().manual_seed(0)
        return torch.randn(random_n, 3, *size, generator=gen), [f"random{i}" for i in range(random_n)]
    if pairs is None:
        pairs = sample_images()
        if not pairs:
            raise ValidationInputError("no sample images available (install scikit-image, scikit-learn or matplotlib)")
    return preprocess(pairs, vit), [name for name, _ in pairs]


# ---- info -----------------------------------------------------------------------------------------
@main.command()
def info() -> None:
    """Versions, ONNX Runtime providers, GPU, and the op library (path, archs, dtypes)."""
    import importlib.metadata as md

    def version(dist: str) -> str:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return "not installed"

    import raggedvit

    click.echo(f"raggedvit     {raggedvit.__version__}")
    for dist in ("torch", "triton", "timm", "onnx"):
        click.echo(f"{dist:<13} {version(dist)}")
    from raggedvit._versions import check_versions

    for line in check_versions():
        click.echo(f"warning: {line}", err=True)
    from raggedvit.cli.ort_dist import status

    ort = status()
    click.echo(f"{'onnxruntime':<13} {ort.describe()}")
    if ort.warning:
        click.echo(f"warning: {ort.warning}", err=True)
    if ort.version is not None:
        click.echo(f"ORT providers {', '.join(ort.providers)}")
    import torch

    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            cap = torch.cuda.get_device_capability(i)
            click.echo(f"GPU {i}         {torch.cuda.get_device_name(i)} (sm_{cap[0]}{cap[1]})")
    else:
        click.echo("GPU           none (torch.cuda.is_available() is False)")
    from raggedvit.custom_ops import OpLibraryNotBuilt, cubin_summary, library_info

    try:
        lib = library_info()
    except (OpLibraryNotBuilt, OSError) as e:
        click.echo(f"op library    not available: {str(e).splitlines()[0]}")
        return
    click.echo(f"op library    {lib.get('path')}")
    flat = {k: v for k, v in lib.items() if k != "path" and not isinstance(v, dict)}
    for group in (v for v in lib.values() if isinstance(v, dict)):  # e.g. "build": archs, dtypes, configs
        flat.update({k: (f"{len(v)} entries" if isinstance(v, dict) else v) for k, v in group.items()})
    for key in sorted(flat):
        value = flat[key]
        click.echo(f"  {key:<16} {', '.join(map(str, value)) or '-' if isinstance(value, list) else value}")
    click.echo("cubins")
    for op, n, size, archs in cubin_summary(lib.get("build", {})):
        where = f"sm_{', sm_'.join(map(str, archs))}" if archs else "no arch"
        click.echo(f"  {op:<16} {n} ({size / 2**20:.1f} MiB; {where})")
