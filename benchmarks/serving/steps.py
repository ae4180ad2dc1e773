"""The serving benchmark's variants as steps on one input batch, plus torch.compile bookkeeping.

A step is `(run, results)` (benchmarks.e2e.variants.Step): run() is the timed call on data already on the device,
results() -> (logits [B, classes], token_counts [B, stages] int64 or None) read after a run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.e2e.variants import Step, ort_step, torch_step

__all__ = ["CompiledModel", "OrtExport", "compiled_step", "reset_dynamo"]

_CUDAGRAPH_LOGGER = "torch._inductor.cudagraph_utils.__cudagraphs"  # torch._logging artifact "cudagraphs"


class _Messages(logging.Handler):
    """Collects the text of the records a logger emits (inductor's "skipping cudagraphs due to ..." warnings)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage()[:300])


def _graph_breaks() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return dict(counters["graph_break"])


def _dynamo_counts() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return {
        "graph_breaks": sum(counters["graph_break"].values()),
        "unique_graphs": int(counters["stats"]["unique_graphs"]),
        "cudagraph_skips": int(counters["inductor"]["cudagraph_skips"]),
    }


_RECOMPILE_LIMIT = 64  # per code object: every PrunedViT / timm model instance and batch shape adds cache entries


def reset_dynamo() -> None:
    """Empty dynamo's caches (compiled frames, automatic-dynamic state, CUDA graph trees) and raise its recompile
    limit above what one model's variants and batch sizes need (past it dynamo silently runs eager)."""
    import torch._dynamo

    torch._dynamo.reset()
    for name in ("recompile_limit", "cache_size_limit"):  # cache_size_limit: the older name
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(int(getattr(torch._dynamo.config, name)), _RECOMPILE_LIMIT))


class CompiledModel:
    """torch.compile(model, mode="reduce-overhead") (inductor + CUDA graph trees), compiled once and reused across
    batch sizes: dynamo recompiles when a new shape needs it (the default: batch 1 specialised, then one graph with
    a dynamic batch), CUDA graph trees record one graph per shape on that shape's first calls.

    `first_call(images)` runs the first forward at a batch and returns its bookkeeping (seconds, dynamo graphs and
    graph breaks added, cudagraph skips with inductor's reasons); `__call__` marks a new CUDA-graph-tree step and
    runs the model (outputs are overwritten by the next step: read them before).
    """

    def __init__(self, model: nn.Module, *, dynamic: bool | None = None) -> None:
        import torch._dynamo

        # PrunedViT's data-dependent stages (cls-mass) use torch.nonzero: without this dynamo breaks the graph there
        torch._dynamo.config.capture_dynamic_output_shape_ops = True
        self.model = model
        self.fn = torch.compile(model, mode="reduce-overhead", dynamic=dynamic)
        self.calls: dict[int, dict[str, Any]] = {}
        self.error: str | None = None  # the first failure: later batches are not compiled again

    def __call__(self, images: torch.Tensor) -> Any:
        torch.compiler.cudagraph_mark_step_begin()
        return self.fn(images)

    def first_call(self, images: torch.Tensor, sync: Callable[[], None]) -> dict[str, Any]:
        handler = _Messages()
        log = logging.getLogger(_CUDAGRAPH_LOGGER)
        log.addHandler(handler)
        before, breaks = _dynamo_counts(), _graph_breaks()
        t0 = time.perf_counter()
        try:
            for _ in range(3):  # compile (or reuse), warm-up run, CUDA-graph record
                self(images)
            sync()
        except Exception as exc:
            self.error = f"at batch {images.shape[0]}: {type(exc).__name__}: {exc}".replace("\n", " ")[:600]
            raise
        finally:
            log.removeHandler(handler)
        after = _dynamo_counts()
        info: dict[str, Any] = {
            "first_calls_s": round(time.perf_counter() - t0, 2),
            **{k: after[k] - before[k] for k in after},
            "cudagraph_skip_reasons": sorted(set(handler.messages)),
            "graph_break_reasons": sorted(k[:300] for k, n in _graph_breaks().items() if n > breaks.get(k, 0)),
        }
        self.calls[int(images.shape[0])] = info
        return info


def compiled_step(model: CompiledModel, images: torch.Tensor) -> Step:
    """A step calling the compiled model (each call a new CUDA-graph-tree step)."""
    return torch_step(model, images)


class OrtExport:
    """A raggedvit export at one batch size: a CUDA graph (raggedvit.runtime.GraphRunner) when `graph` and the
    export has static shapes, else node by node (create_session with the batch fixed, io binding).

    `mode` says which ran ("cuda_graph" / "node_by_node"); `graph_error` holds why a wanted CUDA graph could not
    be built (the step then runs node by node)."""

    def __init__(self, path: Path, device: str, batch: int, images32: torch.Tensor, *, graph: bool) -> None:
        from raggedvit.runtime import GraphRunner, create_session

        self.path, self.device, self.batch = path, device, batch
        self.graph_error: str | None = None
        self.mode = "node_by_node"
        if graph:
            try:
                runner = GraphRunner(path, batch)
                runner.images.copy_(images32)
                torch.cuda.synchronize()
                runner.replay()  # the graph on the real images (GraphRunner warmed up on zeros)
                self._runner: Any = runner
                self.mode = "cuda_graph"
                return
            except Exception as exc:  # noqa: BLE001 - recorded, the export then runs node by node
                self.graph_error = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:400]
        self._session = create_session(path, device, batch=batch)
        self._step = ort_step(self._session, images32)

    def step(self) -> Step:
        if self.mode == "cuda_graph":
            runner = self._runner

            def results() -> tuple[torch.Tensor, torch.Tensor | None]:
                counts = runner.token_counts
                return runner.logits, (counts if counts.numel() else None)

            return runner.replay, results
        return self._step

    def node_by_node_step(self, images32: torch.Tensor) -> tuple[Step, Any]:
        """A node-by-node step of the same export (for kernel counts when CUPTI sees no graph kernels);
        returns (step, session) — keep the session alive while the step is used."""
        from raggedvit.runtime import create_session

        session = create_session(self.path, self.device, batch=self.batch)
        return ort_step(session, images32), session
