"""Serving an export over HTTP with Ray Serve: `POST /predict` with an image file's bytes, requests batched
(`serve.batch`) and run in ONNX Runtime with the op library registered (CUDA graphs for static-shape exports on
CUDA); the answer is the top-5 classes, the kept token counts and the model name.

    from raggedvit.serving import app
    deit = app("deit_tiny.onnx", replicas=2, max_batch_size=32)   # a Serve application
    serve.run(deit)                    # or `serve run my_module:deit`, on any Ray cluster

The export's path must be valid on every node that runs a replica. `raggedvit serve` (server.serve_forever) runs
the same application on a local Ray instance and shuts it down on SIGINT or SIGTERM.

Modules: `options` (ServeOptions), `decode` (a request body to an image, or a 4xx), `predictor` (sessions,
preprocessing, answers; no Ray), `deployment` (the Serve deployment and its routes), `server` (start to shutdown).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from raggedvit.serving.options import ServeInputError, ServeNotInstalled, ServeOptions, require_serve

if TYPE_CHECKING:
    from ray.serve import Application

__all__ = ["ServeInputError", "ServeNotInstalled", "ServeOptions", "app"]


def app(onnx_path: str | Path, **options: Any) -> Application:
    """The Serve application of the export `onnx_path`; `options` are ServeOptions' fields (device, replicas,
    max_batch_size, batch_wait_ms, name, threads, gpus_per_replica, graph_batches). ServeInputError for a bad
    option or a missing file; ServeNotInstalled without Ray Serve."""
    require_serve()
    from raggedvit.serving.deployment import build_app

    try:
        settings = ServeOptions(**options)
    except TypeError as e:  # an unknown keyword
        raise ServeInputError(f"app(): {e}; the options are ServeOptions' fields") from None
    return build_app(onnx_path, settings)
