"""The settings of one served export, checked once: the Serve application, the server and the CLI read the same
ServeOptions."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from raggedvit import InputError

__all__ = ["ServeInputError", "ServeNotInstalled", "ServeOptions", "graph_batch_sizes", "require_serve"]

Device = Literal["cpu", "cuda"]


class ServeInputError(InputError):
    """A setting or the export cannot be served (the message says which and why)."""


class ServeNotInstalled(ServeInputError):
    """Ray Serve is not installed (the extra `serve`)."""


def require_serve() -> None:
    """ServeNotInstalled, naming the install command, unless Ray Serve and FastAPI import."""
    try:
        import fastapi  # noqa: F401
        import ray.serve  # noqa: F401
    except ImportError as e:
        raise ServeNotInstalled(
            f"serving needs Ray Serve (cannot import {e.name or e}): pip install 'raggedvit[serve]'"
        ) from None


def graph_batch_sizes(max_batch_size: int) -> tuple[int, ...]:
    """The batch sizes captured as CUDA graphs by default: 1, 2, 4, ... below max_batch_size, and max_batch_size
    (a batch of n runs at the smallest captured size >= n, padded)."""
    sizes = []
    b = 1
    while b < max_batch_size:
        sizes.append(b)
        b *= 2
    return (*sizes, max_batch_size)


@dataclass(frozen=True)
class ServeOptions:
    """How an export is served.

    device: ONNX Runtime's CPU EP or CUDA EP (static-shape exports then run as CUDA graphs, GraphRunner).
    replicas: Serve replicas, each with its own ORT session(s).
    max_batch_size, batch_wait_ms: `serve.batch` forms a batch of up to max_batch_size requests, waiting at most
    batch_wait_ms after the first.
    name: the model name of the answers and of the Serve application (default: the export file's stem).
    threads: ORT intra-op threads of each CPU replica, also its Ray `num_cpus` (None: ORT's default, 1 CPU for Ray).
    gpus_per_replica: each CUDA replica's Ray `num_gpus` (a fraction shares a GPU between replicas).
    graph_batches: CUDA, static-shape exports: the batch sizes captured (None: graph_batch_sizes(max_batch_size)).
    """

    device: Device = "cpu"
    replicas: int = 1
    max_batch_size: int = 32
    batch_wait_ms: float = 5.0
    name: str | None = None
    threads: int | None = None
    gpus_per_replica: float = 1.0
    graph_batches: tuple[int, ...] | None = field(default=None)

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise ServeInputError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        for what, value, lo in (("replicas", self.replicas, 1), ("max_batch_size", self.max_batch_size, 1)):
            if not isinstance(value, int) or value < lo:
                raise ServeInputError(f"{what} must be an integer >= {lo}, got {value!r}")
        if not (math.isfinite(self.batch_wait_ms) and self.batch_wait_ms >= 0):
            raise ServeInputError(f"batch_wait_ms must be >= 0 and finite, got {self.batch_wait_ms!r}")
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            raise ServeInputError(f"threads must be an integer >= 1, got {self.threads!r}")
        if not (math.isfinite(self.gpus_per_replica) and 0 < self.gpus_per_replica <= 1):
            raise ServeInputError(f"gpus_per_replica must be in (0, 1], got {self.gpus_per_replica!r}")
        if self.name is not None and (not self.name or any(c in self.name for c in "/\\\0")):
            raise ServeInputError(f"name {self.name!r} is not a model name (no '/' or '\\\\', not empty)")
        if self.graph_batches is not None:
            sizes = tuple(self.graph_batches)
            if not sizes or any(not isinstance(b, int) or b < 1 for b in sizes) or max(sizes) < self.max_batch_size:
                raise ServeInputError(
                    f"graph_batches must be positive integers reaching max_batch_size {self.max_batch_size}, "
                    f"got {sizes!r}"
                )
            object.__setattr__(self, "graph_batches", tuple(sorted(set(sizes))))

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """The CUDA graphs' batch sizes (graph_batches or the default)."""
        return self.graph_batches or graph_batch_sizes(self.max_batch_size)

    @property
    def max_ongoing_requests(self) -> int:
        """Requests a replica takes at once: a full batch running and the next one forming."""
        return 2 * self.max_batch_size

    def actor_options(self) -> dict[str, float]:
        """Each replica's Ray resources."""
        if self.device == "cuda":
            return {"num_cpus": 1, "num_gpus": self.gpus_per_replica}
        return {"num_cpus": self.threads or 1}
