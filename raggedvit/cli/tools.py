"""The `raggedvit bench`, `triton-repo` and `coverage` commands, kept apart from the core commands of
raggedvit.cli.app (raggedvit.cli adds them to the group). Same contract: thin over library functions, input errors
as CliError."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from raggedvit.cli.contract import (
    CliError,
    check_folder,
    check_memory,
    check_range,
    check_writable,
    is_ort_error,
    parse_int_list,
    require_device,
    require_onnxruntime_cli,
)

if TYPE_CHECKING:
    from raggedvit.coverage.report import CoverageReport

__all__ = ["bench", "coverage", "triton_repo"]


@click.command()
@click.argument("onnx_file", metavar="MODEL.onnx", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", help="ONNX Runtime execution provider.")
@click.option("--batch", "batches", default="1,4,32", help="Comma-separated batch sizes.")
@click.option("--seconds", type=float, default=0.5, help="Timed seconds per batch size (median reported).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Output.")
@click.option(
    "--cuda-graph",
    is_flag=True,
    help="Replay the model as a CUDA graph (--device cuda; topk-l2 / evit exports without --fuse).",
)
@click.option(
    "--random",
    "random_inputs",
    is_flag=True,
    help="Seeded noise images instead of the sample photos (pruning keeps other tokens of noise).",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="PNG of img/s per batch size (needs matplotlib: pip install 'raggedvit[images]').",
)
def bench(
    onnx_file: Path,
    device: str,
    batches: str,
    seconds: float,
    json_path: Path | None,
    cuda_graph: bool,
    random_inputs: bool,
    plot_path: Path | None,
) -> None:
    """Images per second of an exported model in ONNX Runtime (sample photos, io binding on CUDA)."""
    import json

    require_onnxruntime_cli()

    if not onnx_file.is_file():
        raise CliError(f"no such file: {onnx_file}")
    sizes = parse_int_list("--batch", batches, lo=1, what="positive integers")
    check_range("--seconds", seconds, 0.0, lo_open=True)
    if cuda_graph and device != "cuda":
        raise CliError("--cuda-graph needs --device cuda")
    if json_path is not None:
        check_writable(json_path, "--json")
    if plot_path is not None:
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:  # before minutes of timing, not after
            raise CliError("--plot needs matplotlib: pip install 'raggedvit[images]' (or matplotlib)")
        check_writable(plot_path, "--plot")
    require_device(device)
    from raggedvit.images import NoSampleImages
    from raggedvit.timing.bench import bench_onnx
    from raggedvit.validators.reference import load_recipe

    size = int(load_recipe(onnx_file).get("img_size") or 0)  # a readable raggedvit export, else ValidationInputError
    check_memory(f"--batch {max(sizes)}", max(sizes) * 3 * size * size * 4)  # the float32 input images
    try:
        results = bench_onnx(
            onnx_file, device=device, batches=sizes, seconds=seconds, cuda_graph=cuda_graph, random=random_inputs
        )
    except NoSampleImages as e:
        raise CliError(f"{e}; or pass --random to time seeded noise images") from None
    except KeyError as e:
        raise CliError(f"{onnx_file}: {e.args[0]}") from None
    except ValueError as e:  # e.g. a data-dependent (cls-mass) export with --cuda-graph
        raise CliError(str(e)) from None
    except Exception as e:
        if is_ort_error(e):  # the model does not load or run in ONNX Runtime
            raise CliError(f"ONNX Runtime cannot run {onnx_file.name}: {' '.join(str(e).split())[:400]}") from None
        raise
    click.echo(f"{'batch':>5} {'latency ms':>11} {'img/s':>9}  mean kept tokens per stage")
    for r in results:
        click.echo(f"{r.batch:>5} {r.latency_ms:>11.3f} {r.img_per_s:>9.1f}  {[round(t, 1) for t in r.mean_tokens]}")
    if json_path is not None:
        from raggedvit.outputs import atomic_write

        payload = {
            "model": str(onnx_file),
            "device": device,
            "cuda_graph": cuda_graph,
            "inputs": "random" if random_inputs else "sample photos",
            "results": [r.as_dict() for r in results],
        }
        try:
            atomic_write(json_path, json.dumps(payload, indent=2))
        except OSError as e:
            raise CliError(f"cannot write --json {str(json_path)!r}: {e.strerror or e}") from None
    if plot_path is not None:
        from raggedvit.timing.bench import plot_results

        title = f"{onnx_file.name}, ONNX Runtime {device.upper()} EP{' (CUDA graph)' if cuda_graph else ''}"
        try:
            plot_results(results, plot_path, title=title)
        except OSError as e:
            raise CliError(f"cannot write --plot {str(plot_path)!r}: {e.strerror or e}") from None
        click.echo(f"wrote {plot_path}")


# ---- triton-repo ----------------------------------------------------------------------------------
@click.command("triton-repo")
@click.argument("onnx_file", metavar="MODEL.onnx", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("repo_dir", metavar="DIR", type=click.Path(file_okay=False))
@click.option("--name", default=None, help="Model name and folder under DIR (default: the file name's stem).")
@click.option("--max-batch-size", type=click.IntRange(min=0), default=32, help="Largest batch Triton forms.")
@click.option("--instances", type=click.IntRange(min=1), default=1, help="Model instances (per GPU for gpu).")
@click.option("--kind", type=click.Choice(["gpu", "cpu"]), default="gpu", help="Instance kind: CUDA EP or CPU EP.")
@click.option(
    "--server-repo",
    default="/models",
    help="Absolute path of DIR as the server sees it (the config names the op library by its absolute path).",
)
def triton_repo(onnx_file, repo_dir, name, max_batch_size, instances, kind, server_repo) -> None:
    """Write a Triton Inference Server model repository DIR/NAME for MODEL.onnx (config.pbtxt, 1/model.onnx, the
    op library)."""
    from raggedvit.triton_repo import write_model_repository

    if not repo_dir:  # an unset shell variable: not the current folder
        raise CliError("DIR is empty (''): name the folder of the model repository")
    repo_dir = Path(repo_dir)
    check_folder(repo_dir, "DIR")
    try:
        repo = write_model_repository(
            onnx_file,
            repo_dir,
            name=name,
            max_batch_size=max_batch_size,
            instances=instances,
            kind=kind,
            server_repo=server_repo,
        )
    except ValueError as e:  # bad model or arguments
        raise CliError(str(e)) from None
    except OSError as e:  # op library not built, unwritable DIR
        where = f" {str(e.filename)!r}" if e.filename else ""
        raise CliError(f"cannot write the model repository{where}: {e.strerror or e}") from None
    batching = f"batches up to {repo.max_batch_size}" if repo.max_batch_size else "fixed batch: max_batch_size 0"
    click.echo(f"wrote {repo.model_dir} (config.pbtxt, 1/model.onnx, {repo.library.name}; {batching})")
    click.echo(f"serve with: tritonserver --model-repository={server_repo} (DIR mounted at {server_repo})")


# ---- coverage -------------------------------------------------------------------------------------
@click.command()
@click.option(
    "--out", type=click.Path(dir_okay=False, path_type=Path), default=Path("docs/coverage.md"), help="Markdown table."
)
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Details.")
@click.option("--jobs", type=int, default=1, help="Models checked at once, each in its own process.")
@click.option("--filter", "pattern", default="*", help="Comma-separated globs over timm.list_models() names.")
@click.option("--depth", type=int, default=2, help="Blocks kept of each model (the pruning stage is at block 1).")
@click.option("--img-size", type=int, default=224, help="Largest image side, where timm accepts a smaller img_size.")
@click.option("--timeout-s", type=float, default=120.0, help="Seconds per model before its process is killed.")
@click.option("--shard", default=None, metavar="K/N", help="Check only every N-th model from the K-th (K = 1..N).")
@click.option(
    "--merge",
    "merge_paths",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    multiple=True,
    help="Check nothing: join the --json files of shards 1/N..N/N into --out (and --json). Repeatable.",
)
def coverage(
    out: Path,
    json_path: Path | None,
    jobs: int,
    pattern: str,
    depth: int,
    img_size: int,
    timeout_s: float,
    shard: str | None,
    merge_paths: tuple[Path, ...],
):
    """Which ViT-like timm models PrunedViT runs, exports and matches: a Markdown table (and JSON details).

    A model is ViT-like when, built on the meta device, it has `blocks` and `patch_embed`. Each is checked with
    its first DEPTH blocks and seeded weights, in a child process. Failures are rows of the table, not errors.
    A CI matrix runs `--shard K/N --json shardK.json` per job, then `--merge shard1.json ... shardN.json`.
    """
    if jobs < 1 or depth < 2 or img_size < 1 or timeout_s <= 0:
        raise CliError(
            f"--jobs, --img-size and --timeout-s must be positive and --depth at least 2, got jobs={jobs}, "
            f"depth={depth}, img-size={img_size}, timeout-s={timeout_s:g}"
        )
    for path, what in ((out, "--out"), (json_path, "--json")):
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)  # docs/ of a fresh checkout
            except OSError as e:
                raise CliError(f"cannot create the folder of {what} {str(path)!r}: {e.strerror or e}") from None
            check_writable(path, what)
    import json

    from raggedvit.coverage import COLUMNS, CoverageReport, eta_seconds, merge_reports, parse_shard, run_coverage

    try:
        shard_kn = parse_shard(shard) if shard is not None else None
    except ValueError as e:
        raise CliError(f"--{e}") from None
    if merge_paths:
        try:
            report = merge_reports([CoverageReport.from_dict(json.loads(p.read_text())) for p in merge_paths])
        except (ValueError, KeyError, TypeError) as e:  # not coverage JSON, or not the shards of one sweep
            raise CliError(f"--merge: {e}") from None
        _write_coverage(report, out, json_path)
        return

    def progress(done: int, total: int, rec: dict, elapsed_s: float) -> None:
        marks = " ".join(f"{c}={'-' if rec.get(c) is None else ('ok' if rec[c] else 'FAIL')}" for c in COLUMNS)
        eta = f", ETA {_duration(eta_seconds(done, total, elapsed_s))}" if done < total else ""
        click.echo(f"[{done}/{total}] {rec['name']}: {marks} ({rec.get('wall_s', 0):.0f} s{eta})", err=True)

    report = run_coverage(
        pattern, depth=depth, img_size=img_size, jobs=jobs, timeout_s=timeout_s, shard=shard_kn, progress=progress
    )
    if not report.models and not report.not_built:
        raise CliError(f"no ViT-like timm model matches --filter {pattern!r}")
    _write_coverage(report, out, json_path)


def _duration(seconds: float) -> str:
    """12 s, 3 min 20 s, 1 h 05 min."""
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def _write_coverage(report: CoverageReport, out: Path, json_path: Path | None) -> None:
    report.write_markdown(out)
    if json_path is not None:
        report.write_json(json_path)
    t = report.totals()
    click.echo(
        f"wrote {out}{f' and {json_path}' if json_path else ''}: {t['vit_like']} ViT-like, {t['runs']} run in "
        f"PrunedViT, {t['exports']} export, {t['matches']} match ({report.meta['wall_s']:.0f} s)"
    )
