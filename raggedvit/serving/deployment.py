"""The Ray Serve deployment of an export: HTTP routes over a Predictor, requests batched with `serve.batch`.

    POST /predict   an image file's bytes -> 200 {"top5": [[class, probability], ...], "token_counts": [...],
                    "model": NAME} with header X-Raggedvit-Batch-Size (the size of the batch it ran in);
                    4xx {"error": one line} for a body that is no image (raggedvit.serving.decode), 500 {"error": ...}
                    when the run fails
    GET  /health    200 {"status": "ok", "model": NAME, "device": ..., "max_batch_size": ..., "batch_wait_ms": ...}

Each request is decoded and preprocessed on its own (in a worker thread), so a bad body never reaches a batch;
the batch runs in a worker thread too, so the replica's event loop keeps taking requests while it runs. Requests
enter the batch queue only while no batch runs (`_idle`): `serve.batch` closes a batch when its wait ends even
while the previous batch still runs, so under load it would run many small batches one after the other; held at
the gate, the requests that arrive during a run form the next batch together, up to max_batch_size.
(No `from __future__ import annotations` here: FastAPI reads the routes' annotations at run time.)
"""

import asyncio
from pathlib import Path

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from ray import serve

from raggedvit.serving.decode import MAX_BODY_BYTES, RequestError
from raggedvit.serving.options import ServeInputError, ServeOptions
from raggedvit.serving.predictor import Answer, Predictor

__all__ = ["BATCH_HEADER", "DEPLOYMENT", "RaggedViTServer", "build_app"]

BATCH_HEADER = "X-Raggedvit-Batch-Size"
DEPLOYMENT = "RaggedViT"  # replica processes are named ServeReplica:<application>:RaggedViT

api = FastAPI(title="raggedvit", docs_url=None, redoc_url=None, openapi_url=None)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": " ".join(message.split())}, status_code=status)


@serve.deployment(name=DEPLOYMENT, health_check_period_s=5, health_check_timeout_s=60, graceful_shutdown_timeout_s=5)
@serve.ingress(api)
class RaggedViTServer:
    """One replica: a Predictor and the routes of the module docstring."""

    def __init__(self, onnx_path: str, options: ServeOptions) -> None:
        self.options = options
        self.predictor = Predictor(onnx_path, options)
        self.batched.set_max_batch_size(options.max_batch_size)
        self.batched.set_batch_wait_timeout_s(options.batch_wait_ms / 1000)
        self._idle = asyncio.Event()  # set while no batch runs (module docstring)
        self._idle.set()

    @api.get("/health")
    async def health(self) -> dict:
        o = self.options
        return {
            "status": "ok",
            "model": self.predictor.name,
            "device": o.device,
            "max_batch_size": o.max_batch_size,
            "batch_wait_ms": o.batch_wait_ms,
        }

    @api.post("/predict")
    async def predict(self, request: Request) -> JSONResponse:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
            return _error(413, f"body of {length} bytes is over the limit of {MAX_BODY_BYTES} bytes")
        body = await request.body()
        try:
            image = await asyncio.to_thread(self.predictor.prepare, body, request.headers.get("content-type"))
        except RequestError as e:
            return _error(e.status, e.message)
        await self._idle.wait()
        try:
            result, size = await self.batched(image)
        except Exception as e:  # noqa: BLE001 - the batch failed: a clean 500 for each of its requests
            return _error(500, f"inference failed: {type(e).__name__}: {str(e)[:300]}")
        if isinstance(result, Exception):
            return _error(500, str(result))
        return JSONResponse(result, headers={BATCH_HEADER: str(size)})

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005)  # replaced by the options in __init__
    async def batched(self, images: list[np.ndarray]) -> list[tuple[Answer | ValueError, int]]:
        self._idle.clear()
        try:
            answers = await asyncio.to_thread(self.predictor.predict, np.stack(images))
        finally:
            self._idle.set()
        return [(a, len(images)) for a in answers]


def build_app(onnx_path: str | Path, options: ServeOptions) -> serve.Application:
    """The bound Serve application (raggedvit.serving.app's body)."""
    path = Path(onnx_path).resolve()
    if not path.is_file():
        raise ServeInputError(f"model file {str(onnx_path)!r} does not exist")
    return RaggedViTServer.options(
        num_replicas=options.replicas,
        max_ongoing_requests=options.max_ongoing_requests,
        ray_actor_options=options.actor_options(),
    ).bind(str(path), options)
