"""`raggedvit serve`: an export's Serve application on a local Ray instance (or a running cluster), from start to
shutdown.

    serve_forever("deit_tiny.onnx", ServeOptions(replicas=2), Endpoint("127.0.0.1", 8000), on_ready=print)

The export is checked in this process first (the replica's own Predictor, on the CPU EP), so a file that is no
classifier export, or an op library that cannot load (its path in the message), fails before Ray starts. Then:
a local Ray instance of this machine's CPUs on the loopback only (`address` None; RAY_ADDRESS is ignored: joining a
cluster is `address`'s), or the cluster at `address`; Serve's proxy on the endpoint; the application. SIGINT or
SIGTERM ends the wait as raggedvit.outputs.Interrupted; however it ends, the application is deleted and the local
instance shut down, and any process of it still alive after that (this process's children) is killed: nothing
is left running. Joining a cluster, only the application is deleted: the cluster and its Serve keep running.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from raggedvit.outputs import Interrupted, interrupts_raise, raise_pending_interrupt
from raggedvit.serving.options import ServeInputError, ServeOptions, require_serve

__all__ = ["Endpoint", "ServeStartError", "check_export", "local_options", "serve_forever"]

OBJECT_STORE_BYTES = 512 * 2**20  # request bodies in flight: the local instance needs no more
SHUTDOWN_STEP_S = 20.0  # the longest wait for serve.shutdown, then for ray.shutdown
# Ray's switch (ray_constants.ENABLE_RAY_CLUSTER) for a node reachable on the loopback only: without it the local
# instance's processes talk over this machine's network address (its `_node_ip_address` is resolved to that too)
LOOPBACK_ONLY = ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class ServeStartError(ServeInputError):
    """The application did not start (its replicas failed): the replicas' own message."""


@dataclass(frozen=True)
class Endpoint:
    """Where Serve's HTTP proxy listens, and the cluster to join (None: a local Ray instance)."""

    host: str = "127.0.0.1"
    port: int = 8000
    address: str | None = None
    request_timeout_s: float = 120.0  # a request unanswered by then gets a 408 from the proxy, never hangs

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


def local_options(options: ServeOptions, cpus: int | None = None, gpus: int = 0) -> ServeOptions:
    """The options of a local instance of `cpus` CPUs (default: this machine's) and `gpus` GPUs: CPU replicas
    share the cores (threads = cpus // replicas, at least 1) unless threads are given; CUDA replicas share the GPUs
    (a fraction of one each when there are more replicas than GPUs)."""
    cpus = cpus or os.cpu_count() or 1
    if options.device == "cpu" and options.threads is None:
        return replace(options, threads=max(1, cpus // options.replicas))
    if options.device == "cuda" and gpus > 0:
        return replace(options, gpus_per_replica=min(1.0, gpus / options.replicas))
    return options


def check_export(onnx_path: str | Path, options: ServeOptions) -> str:
    """Builds the replicas' Predictor once here, on the CPU EP with one thread (CUDA is the replicas'): every
    error a replica would raise at start, raised now. Returns the model name the answers carry."""
    from raggedvit.serving.predictor import Predictor

    predictor = Predictor(onnx_path, replace(options, device="cpu", threads=1))
    if options.device == "cuda":
        import onnxruntime as ort

        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise ServeInputError(f"device cuda: onnxruntime {ort.__version__} has no CUDAExecutionProvider here")
    return predictor.name


def _start_error(e: Exception) -> ServeStartError:
    """The replicas' error out of Serve's deployment failure (a traceback in the message): its last line."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    named = [ln for ln in lines if "Error:" in ln and not ln.startswith("ray.")]
    return ServeStartError(f"the application did not start: {(named or lines or [type(e).__name__])[-1][:500]}")


class _LocalProcesses:
    """The processes of the local Ray instance: this process's descendants that were not there before it started,
    remembered as they are seen (a worker whose raylet died is re-parented away, out of reach of children()).
    psutil.Process remembers each one's start time, so a reused PID is never signalled."""

    def __init__(self) -> None:
        import psutil

        self._me = psutil.Process()
        self._before = {p.pid for p in self._me.children(recursive=True)}
        self._seen: dict[int, psutil.Process] = {}

    def update(self) -> None:
        import psutil

        try:
            for p in self._me.children(recursive=True):
                if p.pid not in self._before:
                    self._seen.setdefault(p.pid, p)
        except psutil.Error:  # a child that exited while listed
            pass

    def kill(self, timeout_s: float = 10.0) -> None:
        """Terminates every one still running, then kills those alive after `timeout_s`."""
        import psutil

        self.update()
        procs = [p for p in self._seen.values() if _running(p)]
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.terminate()
        _, alive = psutil.wait_procs(procs, timeout=timeout_s)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(alive, timeout=timeout_s)


def _running(p) -> bool:
    import psutil

    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _bounded(step: Callable[[], None], timeout_s: float) -> None:
    """Runs `step` in a thread for at most `timeout_s` (a Serve or Ray call that waits on a process already gone
    must not hold the shutdown); its errors are dropped: what it left running is killed afterwards."""

    def run() -> None:
        with contextlib.suppress(Exception):
            step()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout_s)


def _shutdown(name: str, processes: _LocalProcesses | None) -> None:
    """Deletes the application; then shuts the local instance down and kills what is left of it (`processes`), or
    disconnects from the cluster (None). Signals are ignored meanwhile: the shutdown is what they asked for."""
    import ray
    from ray import serve

    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in _SIGNALS}
    try:
        if processes is not None:
            processes.update()
        if ray.is_initialized():
            _bounded(serve.shutdown if processes is not None else lambda: serve.delete(name), SHUTDOWN_STEP_S)
            _bounded(ray.shutdown, SHUTDOWN_STEP_S)
        if processes is not None:
            processes.kill()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def serve_forever(
    onnx_path: str | Path,
    options: ServeOptions,
    endpoint: Endpoint,
    *,
    on_ready: Callable[[str], None] = print,
) -> None:
    """Serve `onnx_path` until SIGINT or SIGTERM (raised as Interrupted), then shut everything down (module
    docstring). on_ready(url) is called once the application answers."""
    local = endpoint.address is None
    if local and "ray" not in sys.modules:  # read when ray is imported, here and by every process it starts
        os.environ[LOOPBACK_ONLY[0]] = LOOPBACK_ONLY[1]
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # a local instance reports nowhere
    require_serve()
    import ray
    from ray import serve

    from raggedvit.serving.deployment import build_app

    name = check_export(onnx_path, options)
    options = replace(options, name=name)
    restore = lambda: None  # noqa: E731
    processes = _LocalProcesses() if local else None
    try:
        try:
            if local:
                os.environ.pop("RAY_ADDRESS", None)
                ray.init(
                    address="local",
                    num_cpus=max(os.cpu_count() or 1, options.replicas if options.device == "cpu" else 1),
                    include_dashboard=False,
                    object_store_memory=OBJECT_STORE_BYTES,
                    log_to_driver=False,
                    logging_level="warning",
                    _node_ip_address="127.0.0.1",
                )
            else:
                ray.init(address=endpoint.address, log_to_driver=False, logging_level="warning")
        except ConnectionError as e:  # no cluster there, or one that refuses this driver (its auth token)
            raise ServeStartError(f"cannot join the Ray cluster at {endpoint.address}: {e}") from None
        except SystemExit as e:  # ray.init's own SIGTERM handler exits
            if e.code == signal.SIGTERM:
                raise Interrupted(signal.SIGTERM) from None
            raise
        restore = interrupts_raise()  # ray.init replaced the SIGTERM handler
        if local:
            gpus = int(ray.cluster_resources().get("GPU", 0))
            options = local_options(options, gpus=gpus)
        application = build_app(onnx_path, options)
        logging.getLogger("ray.serve").setLevel(logging.WARNING)  # the ready line is on_ready's
        serve.start(
            http_options={"host": endpoint.host, "port": endpoint.port, "request_timeout_s": endpoint.request_timeout_s}
        )
        try:
            serve.run(application, name=name, route_prefix="/")
        except (RuntimeError, ray.exceptions.RayError) as e:
            raise _start_error(e) from None
        on_ready(endpoint.url)
        while True:
            time.sleep(0.5)
            raise_pending_interrupt()
            if processes is not None:
                processes.update()
    finally:
        _shutdown(name, processes)
        restore()
