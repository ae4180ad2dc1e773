"""The serving benchmark's variants as steps on one input batch, plus torch.compile bookkeeping.

A step is `(run, results)` (benchmarks.e2e.variants.Step): run() is the timed call on data already on the device,
results() -> (logits [B, classes], token_counts [B, stages] int64 or None) read after a run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.e2e.variants import Step, ort_step, torch_step

__all__ = [
    "CompiledModel",
    "GraphedModel",
    "OrtExport",
    "compiled_step",
    "engine_declined",
    "engine_probe",
    "reset_dynamo",
]

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
    be built (the step then runs node by node). `cpu_fallback=False` (on CUDA): the node-by-node sessions are
    created with the CPU EP fallback off, so no node (a RaggedViTBlock without its CUDA kernel's types, say) runs on
    the CPU EP unseen; when that session cannot be created either, the constructor raises a RuntimeError with the
    CUDA graph's and the session's errors. (A CUDA graph session needs every node on the CUDA EP anyway.)"""

    def __init__(
        self, path: Path, device: str, batch: int, images32: torch.Tensor, *, graph: bool, cpu_fallback: bool = True
    ) -> None:
        from raggedvit.runtime import GraphRunner

        self.path, self.device, self.batch = path, device, batch
        self.strict = device == "cuda" and not cpu_fallback
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
        try:
            self._session = self._node_by_node_session()
        except Exception as exc:
            if self.graph_error is None:
                raise
            why = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:400]
            off = " (CPU EP fallback off)" if self.strict else ""
            raise RuntimeError(
                f"CUDA graph failed: {self.graph_error}; the node-by-node session{off} failed too: {why}"
            ) from exc
        self._step = ort_step(self._session, images32)

    def _node_by_node_session(self) -> Any:
        from raggedvit.runtime import create_session

        return create_session(self.path, self.device, batch=self.batch, disable_cpu_fallback=self.strict)

    def step(self) -> Step:
        if self.mode == "cuda_graph":
            runner = self._runner

            def results() -> tuple[torch.Tensor, torch.Tensor | None]:
                counts = runner.token_counts
                return runner.logits, (counts if counts.numel() else None)

            return runner.replay, results
        return self._step

    def node_by_node_step(self, images32: torch.Tensor) -> tuple[Step, Any]:
        """A node-by-node step of the same export (for kernel counts when CUPTI sees no graph kernels; the CPU EP
        fallback as in the constructor); returns (step, session) — keep the session alive while the step is used."""
        session = self._node_by_node_session()
        return ort_step(session, images32), session


@contextmanager
def _counted_engine(counts: dict[str, Any]) -> Iterator[None]:
    """While open, every call of the block engine (raggedvit.kernels.block_engine.vit_block_engine, as the block
    op's CUDA kernel looks it up) adds to counts["calls"]; a TypeError (the engine declining the case: the op then
    runs its per-op kernels) to counts["declined"], the first one's text in counts["reason"]."""
    try:
        from raggedvit.kernels import _block_op, block_engine
    except ImportError as exc:  # no Triton: the op runs its per-op kernels
        counts["reason"] = f"block engine not importable: {type(exc).__name__}: {exc}"[:300]
        yield
        return
    real = block_engine.vit_block_engine

    def counted(*args: Any, **kwargs: Any) -> Any:
        counts["calls"] += 1
        try:
            return real(*args, **kwargs)
        except TypeError as exc:
            counts["declined"] += 1
            counts["reason"] = counts["reason"] or f"TypeError: {exc}".replace("\n", " ")[:300]
            raise

    patched = [m for m in (block_engine, _block_op) if getattr(m, "vit_block_engine", None) is real]
    for m in patched:
        m.vit_block_engine = counted
    try:
        yield
    finally:
        for m in patched:
            m.vit_block_engine = real


def engine_probe(model: nn.Module, images: torch.Tensor) -> dict[str, Any]:
    """One forward of `model` (a PrunedViT(engine="block")) on `images`, counting the block engine's calls:
    {"calls", "declined", "reason", "seconds"} (calls: blocks the engine was asked to run in this forward; CPU
    tensors never reach it: the op's CPU kernel is the reference). The forward also compiles the engine's kernels
    before any CUDA graph capture."""
    counts: dict[str, Any] = {"calls": 0, "declined": 0, "reason": None}
    t0 = time.perf_counter()
    with _counted_engine(counts):
        model(images)
        if images.is_cuda:
            torch.cuda.synchronize()
    counts["seconds"] = round(time.perf_counter() - t0, 2)
    return counts


def engine_declined(probe: dict[str, Any]) -> tuple[str | None, str]:
    """A CUDA forward counted by `engine_probe` -> (why the variant does not measure the engine: it declined every
    block op call or was never called, else None; a note when it declined some: those blocks ran the op's
    per-op kernels, else "")."""
    calls, declined = probe["calls"], probe["declined"]
    why = probe["reason"] or "the block op never called it"
    text = f"the block engine declined {declined} of {calls} block calls: {why}"
    if calls == 0 or declined == calls:
        return text, ""
    return None, (f"{text} (those blocks ran the op's per-op kernels)" if declined else "")


class GraphedModel:
    """`model(images)` (a PrunedViT) at one batch: captured as one torch.cuda.CUDAGraph on a static copy of
    `images` when `graph` (warm-up calls on a side stream first, as torch.cuda.graphs asks), else called eagerly
    (the CPU debug run). `mode` says which ("cuda_graph" / "eager"); capture failures raise.

    `step()` replays the graph (or calls the model); `eager_step()` calls the model on the same input (kernel
    counts when CUPTI sees no graph kernels)."""

    def __init__(self, model: nn.Module, images: torch.Tensor, *, graph: bool, warmup: int = 2) -> None:
        self.model = model
        self.images = images.clone()  # the static input buffer
        self.mode = "eager"
        self._graph: torch.cuda.CUDAGraph | None = None
        if graph:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(warmup):
                    model(self.images)
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                self.out = model(self.images)  # static outputs, overwritten by every replay
            g.replay()
            torch.cuda.synchronize()
            self._graph, self.mode = g, "cuda_graph"

    def step(self) -> Step:
        if self._graph is None:
            return torch_step(self.model, self.images)

        def results() -> tuple[torch.Tensor, torch.Tensor | None]:
            return self.out.logits, self.out.token_counts

        return self._graph.replay, results

    def eager_step(self) -> Step:
        return torch_step(self.model, self.images)
