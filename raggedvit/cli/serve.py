"""The `raggedvit serve` command: thin over raggedvit.serving.server (Ray Serve; the extra `serve`). Same contract as
every command: input errors as one `error:` line and exit 2; SIGINT or SIGTERM stop the server, exit 130."""

from __future__ import annotations

import errno
import socket
from pathlib import Path

import click

from raggedvit.cli.contract import CliError, check_readable_file, require_device, require_onnxruntime_cli

__all__ = ["serve"]


def _check_port_free(host: str, port: int) -> None:
    """CliError when `host`:`port` cannot be listened on (in use, or not an address of this machine), before Ray
    starts."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise CliError(f"--host {host!r} is not an address: {e.strerror}") from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind(address)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise CliError(f"port {port} on {host} is in use: pass another --port") from None
            raise CliError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


@click.command()
@click.argument("onnx_file", metavar="MODEL.onnx", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", help="ONNX Runtime execution provider.")
@click.option("--replicas", type=click.IntRange(min=1), default=1, help="Serve replicas (each its own ORT session).")
@click.option("--max-batch-size", type=click.IntRange(min=1), default=32, help="Largest batch a replica forms.")
@click.option(
    "--batch-wait-ms",
    type=click.FloatRange(min=0),
    default=5.0,
    help="Longest wait for a batch to fill after its first request.",
)
@click.option("--host", default="127.0.0.1", help="Address the HTTP proxy listens on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, help="Port the HTTP proxy listens on.")
@click.option(
    "--address",
    default=None,
    help="Join the Ray cluster at ADDR (host:port) instead of starting a local Ray instance; MODEL.onnx must be at "
    "the same path on its nodes.",
)
def serve(onnx_file, device, replicas, max_batch_size, batch_wait_ms, host, port, address) -> None:
    """Serve MODEL.onnx over HTTP with Ray Serve until Ctrl-C or SIGTERM: POST /predict with an image file's bytes
    answers {"top5": [[class, probability], ...], "token_counts": [...], "model": NAME}; GET /health."""
    require_onnxruntime_cli()
    check_readable_file(onnx_file, "model file")
    require_device(device)
    from raggedvit.serving.options import ServeOptions
    from raggedvit.serving.server import Endpoint, serve_forever

    if address is None:
        _check_port_free(host, port)
    options = ServeOptions(device=device, replicas=replicas, max_batch_size=max_batch_size, batch_wait_ms=batch_wait_ms)
    where = f"the Ray cluster at {address}" if address else "a local Ray instance"

    def ready(url: str) -> None:
        click.echo(
            f"serving {onnx_file.name} at {url}/predict (GET {url}/health) on {where}: {device}, {replicas} "
            f"replica{'s' * (replicas > 1)}, batches of up to {max_batch_size} within {batch_wait_ms:g} ms; "
            "Ctrl-C stops it"
        )

    serve_forever(onnx_file, options, Endpoint(host, port, address), on_ready=ready)
