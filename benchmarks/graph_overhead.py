"""Probe: how much of a CUDA-graph run's wall time is not GPU time, at serving batch sizes.

    python3 -m benchmarks.graph_overhead [--out benchmarks/results] [--work DIR]
        [--models deit_base,deit_small] [--policies ...] [--batches 1,4,32]

At B = 1 and 4 the issue's bars are judged on img/s while the forward is ~120 kernels of 3-5 us: every microsecond
outside the kernels counts. For each export (made with benchmarks.serving.exports, the serving run's recipe) and
batch this times, in one process and interleaved over `--rounds` rounds:

- `replay`: `raggedvit.runtime.GraphRunner.replay` (ONNX Runtime's Run on a captured CUDA graph, which synchronizes
  its stream), host wall time per call as `raggedvit.timing.measure` takes it (between two device syncs);
- `replay_nosync`: the same Run with the run option `disable_synchronize_execution_providers` and one device sync;
- `torch_graph`: the export run node by node on a torch stream (the CUDA EP's `user_compute_stream`) and captured
  into a torch CUDA graph, replayed on that stream: Run's host work is left out of the timed call (an experiment:
  ONNX Runtime does not promise that its node-by-node run can be captured from outside; its logits are compared
  with the replay's);

and, with CUPTI (torch.profiler) over a few calls of each: the GPU span of one call (first kernel start to last
kernel end) and its busy time (the kernels' summed durations). wall - span is host time (Run's work, the graph
launch, the sync); span - busy the gaps between the graph's kernels.

Whether a call is bound by its graph's host launch (the driver submitting ~120 nodes) rather than by the GPU:

- per export and batch, unprofiled: the host time of `torch.cuda.CUDAGraph.replay()` alone (no sync) of the
  torch-captured export, and the time per call of 20 back-to-back calls with one sync, for both ONNX Runtime's
  replay and the torch-captured graph (a launch-bound call gains nothing from queueing: the GPU waits for the
  submission); the torch-captured graph's nodes by type, its edges and root nodes (`graph_census`, driver API);
  and ONNX Runtime's optimized graph by op type, with every node that is not a block's compute op;
- `--synthetic`: the same three times for graphs of N = 1, 50, 120 tiny nodes of one kind (a torch elementwise
  kernel, a cuBLAS GEMM, a Triton kernel, a device-to-device copy), the machine's cost per node of a graph launch.

Writes graph_overhead_<date>_<gpu>.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.env import environment, probe_result_path
from benchmarks.serving.exports import ExportJob, export_job
from benchmarks.serving.names import timm_name
from raggedvit.timing import measure

DEFAULT_POLICIES = ("topk-l2:keep=0.5:at=4", "cls-mass:mass=0.9:at=3,6,9")


_NODE_TYPES = ("kernel", "memcpy", "memset", "host", "child_graph", "empty", "wait_event", "event_record",
               "ext_semas_signal", "ext_semas_wait", "mem_alloc", "mem_free", "batch_mem_op",
               "conditional")  # fmt: skip


def graph_census(raw_graph: int) -> dict[str, Any]:
    """A captured CUDA graph (CUgraph handle, `CUDAGraph.raw_cuda_graph()`) through the driver API: its nodes by
    type (CUgraphNodeType), edges, root nodes (more than one: branches from several streams) and kernel nodes by
    function name."""
    import ctypes

    cu = ctypes.CDLL("libcuda.so.1")
    graph = ctypes.c_void_p(raw_graph)
    n = ctypes.c_size_t(0)
    cu.cuGraphGetNodes(graph, None, ctypes.byref(n))
    nodes = (ctypes.c_void_p * n.value)()
    cu.cuGraphGetNodes(graph, nodes, ctypes.byref(n))
    kinds: Counter[str] = Counter()
    kernels: Counter[str] = Counter()
    params = (ctypes.c_void_p * 16)()  # CUDA_KERNEL_NODE_PARAMS: the function handle first
    for node in nodes:
        t = ctypes.c_int(-1)
        cu.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(t))
        kinds[_NODE_TYPES[t.value] if 0 <= t.value < len(_NODE_TYPES) else str(t.value)] += 1
        if t.value == 0 and cu.cuGraphKernelNodeGetParams(ctypes.c_void_p(node), params) == 0:
            name = ctypes.c_char_p()
            ok = cu.cuFuncGetName(ctypes.byref(name), ctypes.c_void_p(params[0])) == 0 and name.value
            kernels[name.value.decode()[:60] if ok else "?"] += 1  # type: ignore[union-attr]
    edges, roots = ctypes.c_size_t(0), ctypes.c_size_t(0)
    cu.cuGraphGetEdges(graph, None, None, ctypes.byref(edges))
    cu.cuGraphGetRootNodes(graph, None, ctypes.byref(roots))
    return {"nodes": n.value, "kinds": dict(kinds), "edges": edges.value, "roots": roots.value,
            "kernels": dict(kernels.most_common())}  # fmt: skip


def host_us(fn: Callable[[], Any], sync: Callable[[], None], calls: int = 200) -> float:
    """Median host time (us) of `fn()` alone, each call after a sync (unprofiled)."""
    times = []
    for _ in range(calls):
        sync()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    sync()
    return round(statistics.median(times) * 1e6, 1)


def queued_us(fn: Callable[[], Any], sync: Callable[[], None], depth: int = 20, calls: int = 30) -> float:
    """Median time per call (us) of `depth` back-to-back calls of `fn` followed by one sync."""

    def burst() -> None:
        for _ in range(depth):
            fn()
        sync()

    return round(host_us(burst, sync, calls) / depth, 1)


def call_spans(kernels: list[tuple[float, float]], gap_us: float = 500.0) -> dict[str, Any]:
    """(start, end) us of CUPTI kernel records of several calls -> the calls seen, and the median kernels, span (first
    start to last end) and busy time (summed durations) of one call; a record starting more than `gap_us` after
    the previous records' last end starts a new call."""
    kernels = sorted(kernels)
    if not kernels:
        return {"calls_seen": 0}
    groups: list[list[tuple[float, float]]] = [[kernels[0]]]
    last_end = kernels[0][1]
    for start, end in kernels[1:]:
        if start - last_end > gap_us:
            groups.append([])
        groups[-1].append((start, end))
        last_end = max(last_end, end)
    return {
        "calls_seen": len(groups),
        "kernels_per_call": statistics.median(len(g) for g in groups),
        "span_us": round(statistics.median(max(e for _, e in g) - g[0][0] for g in groups), 1),
        "busy_us": round(statistics.median(sum(e - s for s, e in g) for g in groups), 1),
    }


def gpu_spans(fn: Callable[[], Any], calls: int = 10) -> dict[str, Any]:
    """`call_spans` of `calls` calls of `fn` under CUPTI (torch.profiler), 2 ms of host sleep between them."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
            torch.cuda.synchronize()
            time.sleep(0.002)
    return call_spans(
        [(e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == DeviceType.CUDA]
    )


def _torch_graph(path: str, batch: int, runner: Any) -> tuple[Callable[[], None], torch.Tensor]:
    """The export node by node on a torch stream, captured into a torch CUDA graph; returns (call: replay + sync,
    its logits); call.launch replays without the sync, call.graph is the torch CUDAGraph."""
    import onnxruntime as ort

    from raggedvit.exporter.metadata import read_recipe
    from raggedvit.runtime import bind_tensor, session_options, tf32_for

    stream = torch.cuda.Stream()
    so = session_options(disable_cpu_fallback=True)
    so.add_free_dimension_override_by_name("batch", batch)
    opts = {"device_id": "0", "use_tf32": "1" if tf32_for(read_recipe(path)) else "0",
            "user_compute_stream": str(stream.cuda_stream)}  # fmt: skip
    sess = ort.InferenceSession(path, so, providers=[("CUDAExecutionProvider", opts)])
    binding = sess.io_binding()
    logits, counts = torch.empty_like(runner.logits), torch.empty_like(runner.token_counts)
    bind_tensor(binding, "images", runner.images)
    bind_tensor(binding, sess.get_outputs()[0].name, logits, output=True)
    bind_tensor(binding, "token_counts", counts, output=True)
    ro = ort.RunOptions()
    ro.add_run_config_entry("disable_synchronize_execution_providers", "1")
    with torch.cuda.stream(stream):
        for _ in range(3):  # the arena grows and the kernels load before the capture
            sess.run_with_iobinding(binding, ro)
        stream.synchronize()
        graph = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.cuda.graph(graph, stream=stream):
            sess.run_with_iobinding(binding, ro)
        graph.instantiate()
    keep = (sess, binding, stream, graph, counts)

    def launch() -> None:
        with torch.cuda.stream(stream):
            graph.replay()

    def call() -> None:
        launch()
        stream.synchronize()

    call.keep = keep  # type: ignore[attr-defined]
    call.graph = graph  # type: ignore[attr-defined]
    call.launch = launch  # type: ignore[attr-defined]
    return call, logits


_COMPUTE_OPS = frozenset({"MatMul", "FusedMatMul", "Gemm", "SkipLayerNormalization", "LayerNormalization", "BiasGelu",
                          "RaggedAttention", "RaggedLinear", "GatherLayerNorm", "PatchEmbed"})  # fmt: skip


def optimized_census(path: str, batch: int, out: Path) -> dict[str, Any]:
    """Op types of ONNX Runtime's optimized graph of the export (CUDA EP, batch fixed), and the other nodes
    (name, op, inputs): where the graph's copies and small kernels come from."""
    import onnx
    import onnxruntime as ort

    from raggedvit.runtime import session_options

    so = session_options(disable_cpu_fallback=True)
    so.add_free_dimension_override_by_name("batch", batch)
    so.optimized_model_filepath = str(out)
    ort.InferenceSession(path, so, providers=[("CUDAExecutionProvider", {"device_id": "0"})])
    nodes = onnx.load(str(out), load_external_data=False).graph.node
    return {
        "ops": dict(Counter(n.op_type for n in nodes)),
        "other_nodes": [[n.name, n.op_type, list(n.input)] for n in nodes if n.op_type not in _COMPUTE_OPS],
    }


def _synthetic_kinds() -> dict[str, Callable[[], Any]]:
    """One tiny node of each kind (CUDA tensors made here, kept alive by the closures)."""
    import triton
    import triton.language as tl

    @triton.jit
    def _inc(X, n, BLOCK: tl.constexpr):  # noqa: N803 - Triton argument names
        offs = tl.arange(0, BLOCK)
        tl.store(X + offs, tl.load(X + offs, mask=offs < n) + 1, mask=offs < n)

    x = torch.zeros(64, device="cuda")
    a = torch.randn(64, 64, device="cuda", dtype=torch.half)
    c = torch.empty_like(a)
    big, src = torch.zeros(1 << 16, device="cuda"), torch.ones(256, device="cuda")
    return {
        "torch_elementwise": lambda: x.add_(1),
        "cublas_gemm": lambda: torch.matmul(a, a, out=c),
        "triton": lambda: _inc[(1,)](x, 64, BLOCK=64),
        "copy_d2d": lambda: big[:256].copy_(src),
    }


def synthetic(node_counts: tuple[int, ...] = (1, 50, 120)) -> list[dict[str, Any]]:
    """For graphs of N tiny nodes of one kind: the host time of replay() alone, replay + sync, and the time per
    replay of 20 queued replays (us)."""
    sync = torch.cuda.synchronize
    stream = torch.cuda.Stream()
    out = []
    for kind, fn in _synthetic_kinds().items():
        for n in node_counts:
            with torch.cuda.stream(stream):
                for _ in range(3):
                    fn()
            sync()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                for _ in range(n):
                    fn()

            def replay_sync(g: torch.cuda.CUDAGraph = graph) -> None:
                g.replay()
                sync()

            rec = {"kind": kind, "nodes": n, "launch_host_us": host_us(graph.replay, sync),
                   "replay_sync_us": host_us(replay_sync, sync),
                   "queued_us": queued_us(graph.replay, sync)}  # fmt: skip
            print(json.dumps(rec), flush=True)
            out.append(rec)
    return out


def _case(path: str, model: str, policy: str, batch: int, rounds: int) -> dict[str, Any]:
    import onnxruntime as ort

    from raggedvit.runtime import GraphRunner

    rec: dict[str, Any] = {"model": model, "policy": policy, "batch": batch}
    runner = GraphRunner(path, batch)
    runner.images.normal_()
    runner.replay()
    want = runner.logits.clone()
    ro = ort.RunOptions()
    ro.add_run_config_entry("disable_synchronize_execution_providers", "1")

    def nosync_run() -> None:
        runner.session.run_with_iobinding(runner.binding, ro)

    def nosync() -> None:
        nosync_run()
        torch.cuda.synchronize()

    calls: dict[str, Callable[[], Any]] = {"replay": runner.replay, "replay_nosync": nosync}
    try:
        call, logits = _torch_graph(path, batch, runner)
        logits.zero_()
        call()
        rec["torch_graph_max_abs_diff"] = float((logits - want).abs().max())
        try:
            rec["torch_graph_census"] = graph_census(call.graph.raw_cuda_graph())  # type: ignore[attr-defined]
        except Exception as exc:  # noqa: BLE001 - recorded
            rec["torch_graph_census"] = {"error": repr(exc)[:300]}
        calls["torch_graph"] = call
        sync = torch.cuda.synchronize
        rec["torch_graph_launch_host_us"] = host_us(call.launch, sync)  # type: ignore[attr-defined]
        rec["torch_graph_queued_us"] = queued_us(call.launch, sync)  # type: ignore[attr-defined]
    except Exception as exc:  # noqa: BLE001 - recorded: ONNX Runtime may refuse the outside capture
        rec["torch_graph_error"] = repr(exc)[:400]
    walls: dict[str, list[float]] = {k: [] for k in calls}
    for r in range(rounds):
        for name in calls if r % 2 == 0 else reversed(list(calls)):
            t = measure(calls[name], torch.cuda.synchronize, target_s=0.15, warmup_s=0.0, min_warmup=5)
            walls[name].append(round(t.median_ms * 1e3, 1))
    rec["replay_queued_us"] = queued_us(nosync_run, torch.cuda.synchronize)
    for name, fn in calls.items():
        rec[name] = {"wall_us": statistics.median(walls[name]), "round_wall_us": walls[name], **gpu_spans(fn)}
        rec[name]["host_us"] = round(rec[name]["wall_us"] - rec[name].get("span_us", 0.0), 1)
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--work", default=None, help="folder for the exports (default: a temporary one)")
    ap.add_argument("--models", default="deit_base,deit_small")
    ap.add_argument("--policies", nargs="+", default=list(DEFAULT_POLICIES))
    ap.add_argument("--batches", default="1,4,32")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--synthetic", action="store_true", help="also time graphs of N tiny nodes of one kind")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="graph_overhead_"))
    work.mkdir(parents=True, exist_ok=True)
    path = probe_result_path(args.out, "graph_overhead")
    records: list[dict[str, Any]] = []
    data: dict[str, Any] = {"benchmark": "graph_overhead", "env": environment(), "records": records}
    if args.synthetic:
        data["synthetic"] = synthetic()
        path.write_text(json.dumps(data, indent=1))
    for model in filter(None, args.models.split(",")):
        for i, policy in enumerate(args.policies):
            made = export_job(ExportJob(timm_name(model), policy, "fp16-all", str(work / f"{model}_{i}.onnx")))
            if made.get("path") is None:
                records.append({"model": model, "policy": policy, "error": made.get("error")})
                continue
            try:
                census = optimized_census(made["path"], 1, work / f"{model}_{i}_optimized.onnx")
            except Exception as exc:  # noqa: BLE001 - recorded
                census = {"error": repr(exc)[:400]}
            records.append({"model": model, "policy": policy, "optimized_graph": census})
            for batch in (int(b) for b in args.batches.split(",")):
                try:
                    rec = _case(made["path"], model, policy, batch, args.rounds)
                except Exception as exc:  # noqa: BLE001 - recorded
                    rec = {"model": model, "policy": policy, "batch": batch, "error": repr(exc)[:400]}
                records.append(rec)
                print(json.dumps(rec), flush=True)
                path.write_text(json.dumps(data, indent=1))
    path.write_text(json.dumps(data, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
