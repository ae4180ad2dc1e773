"""ONNX Runtime session helpers: op library registration, providers, io binding of torch CUDA tensors.

sess = create_session("model.onnx", device="cuda", disable_cpu_fallback=True)
outs = run_with_iobinding(sess, {"qkv": qkv_cuda, "cu_seqlens": cu_cuda}, {"out": out_cuda})

run = GraphRunner("model.onnx", batch=8)        # CUDA graph: one launch per run (static-shape exports)
logits, token_counts = run(images_cuda)          # torch tensors, valid until the next call
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import onnxruntime as ort
from onnx import TensorProto

from raggedvit.custom_ops import library_path

if TYPE_CHECKING:
    import torch

__all__ = [
    "CudaPlacementError",
    "GraphRunner",
    "bind_tensor",
    "create_session",
    "providers_for",
    "run_with_iobinding",
    "session_options",
    "tf32_for",
]

Device = Literal["cpu", "cuda"]
_NO_FALLBACK = "fallback to CPU EP has been explicitly disabled"


class CudaPlacementError(RuntimeError):
    """A CUDA session with CPU fallback disabled has nodes on the CPU EP. `unplaced`: the nodes the CUDA EP has no
    kernel for (raggedvit.exporter.placement), [] when ORT itself moved shape arithmetic to the CPU."""

    def __init__(self, message: str, unplaced: list) -> None:
        super().__init__(message)
        self.unplaced = unplaced


def _placement_error(model: str | Path | bytes, cause: Exception) -> CudaPlacementError:
    import onnx

    from raggedvit.exporter.placement import cuda_unplaced, placement_table

    proto = (
        onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(str(model), load_external_data=False)
    )
    try:
        unplaced = cuda_unplaced(proto)
        version = placement_table().onnxruntime
    except FileNotFoundError as e:
        return CudaPlacementError(f"{cause}; the CUDA placement table is missing ({e.filename})", [])
    if not unplaced:
        return CudaPlacementError(
            "ONNX Runtime put nodes on the CPU EP with CPU fallback disabled, yet every node has a CUDA EP kernel "
            f"(placement table of onnxruntime {version}): ORT moved shape arithmetic on the batch size to the CPU; "
            "pass batch=N so that it folds into constants",
            [],
        )
    names = "; ".join(str(u) for u in unplaced[:5]) + (f"; and {len(unplaced) - 5} more" if len(unplaced) > 5 else "")
    return CudaPlacementError(
        f"{len(unplaced)} node(s) have no CUDA EP kernel (onnxruntime {version}) and would run on the CPU EP, "
        f"which disable_cpu_fallback refuses: {names}",
        unplaced,
    )


def session_options(
    *,
    disable_cpu_fallback: bool = False,
    intra_op_threads: int | None = None,
    optimization: ort.GraphOptimizationLevel = ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    log_severity: int = 3,
) -> ort.SessionOptions:
    """SessionOptions with libraggedvit_ort.so registered.

    disable_cpu_fallback sets `session.disable_cpu_ep_fallback=1`: session creation fails if any node
    (RaggedAttention included) would fall back to the CPU EP, which proves the CUDA kernel is used.
    """
    so = ort.SessionOptions()
    so.register_custom_ops_library(library_path())
    so.graph_optimization_level = optimization
    so.log_severity_level = log_severity
    if intra_op_threads is not None:
        so.intra_op_num_threads = intra_op_threads
    if disable_cpu_fallback:
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    return so


def providers_for(
    device: Device,
    *,
    device_id: int = 0,
    cpu_fallback: bool = True,
    cuda_graph: bool = False,
    tf32: bool = False,
    cuda_options: Mapping[str, str] | None = None,
) -> list[str | tuple[str, dict[str, str]]]:
    """Execution providers for `device` ("cuda": CUDA EP on ORT's default stream, then CPU unless
    cpu_fallback is False: ORT rejects an explicit CPU EP together with session.disable_cpu_ep_fallback=1).
    cuda_graph: the CUDA EP captures the whole run as a CUDA graph and replays it (static shapes only).
    tf32: float32 GEMMs/convolutions may use TF32 tensor cores (inputs rounded to 10 mantissa bits).
    cuda_options: more CUDA EP provider options (e.g. tunable_op_enable), applied after the ones above."""
    if cuda_options and device != "cuda":
        raise ValueError(f"cuda_options need device='cuda', got {device!r}")
    if device == "cpu":
        return ["CPUExecutionProvider"]
    if device == "cuda":
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise RuntimeError(
                f"onnxruntime {ort.__version__} has no CUDAExecutionProvider (install onnxruntime-gpu); "
                f"available: {ort.get_available_providers()}"
            )
        opts = {"device_id": str(device_id), "use_tf32": "1" if tf32 else "0"}
        if cuda_graph:
            opts["enable_cuda_graph"] = "1"
        opts.update(cuda_options or {})
        cuda: tuple[str, dict[str, str]] = ("CUDAExecutionProvider", opts)
        return [cuda, "CPUExecutionProvider"] if cpu_fallback else [cuda]
    raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")


def _config_entry(so: ort.SessionOptions, key: str) -> str:
    try:
        return so.get_session_config_entry(key)
    except RuntimeError:  # not set
        return ""


def create_session(
    model: str | Path | bytes,
    device: Device = "cpu",
    *,
    disable_cpu_fallback: bool = False,
    intra_op_threads: int | None = None,
    device_id: int = 0,
    options: ort.SessionOptions | None = None,
    cuda_graph: bool = False,
    tf32: bool | None = None,
    batch: int | None = None,
    cuda_options: Mapping[str, str] | None = None,
) -> ort.InferenceSession:
    """InferenceSession of `model` (path or serialized bytes) with the RaggedAttention library registered.

    batch: fix the exports' symbolic `batch` dimension (ORT's free-dimension override): the batch-size shape
    arithmetic of a traced graph then folds into constants at session creation, which keeps every node on the
    CUDA EP (no Memcpy) and is required for cuda_graph.
    cuda_graph (device "cuda"): ORT captures the run as a CUDA graph; only for graphs with static shapes at a
    given input shape (raggedvit exports of topk-l2 / evit without fuse; see GraphRunner).
    tf32 (device "cuda"): None = from the model's raggedvit recipe: on for fp16 exports (their float32 patch
    embedding and head otherwise run on FFMA; DESIGN.md section 5), off for fp32 exports and other models
    (float32 stays float32).
    cuda_options (device "cuda"): more CUDA EP provider options (providers_for).
    A CUDA session with CPU fallback disabled whose nodes ORT puts on the CPU EP raises CudaPlacementError, naming
    the nodes that have no CUDA EP kernel (raggedvit.exporter.placement)."""
    if cuda_graph and device != "cuda":
        raise ValueError("cuda_graph needs device='cuda'")
    so = options or session_options(disable_cpu_fallback=disable_cpu_fallback, intra_op_threads=intra_op_threads)
    if batch is not None:
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        so.add_free_dimension_override_by_name("batch", int(batch))
    no_fallback = _config_entry(so, "session.disable_cpu_ep_fallback") == "1"
    if tf32 is None:  # (parses the model once more: callers holding the recipe pass tf32_for(recipe))
        tf32 = device == "cuda" and tf32_for(_recipe(model))
    providers = providers_for(
        device,
        device_id=device_id,
        cpu_fallback=not no_fallback or device == "cpu",
        cuda_graph=cuda_graph,
        tf32=tf32,
        cuda_options=cuda_options,
    )
    src = model if isinstance(model, bytes) else str(model)
    try:
        return ort.InferenceSession(src, so, providers=providers)
    except Exception as e:
        if no_fallback and device == "cuda" and _NO_FALLBACK in str(e):
            raise _placement_error(model, e) from e
        raise


def tf32_for(recipe: dict | None) -> bool:
    """TF32 policy of create_session: on for fp16 exports (fp16, fp16-all), off for fp32 exports and other models."""
    return str((recipe or {}).get("dtype", "")).startswith("fp16")


def _recipe(model: str | Path | bytes) -> dict | None:
    """The recipe of a raggedvit export (None for other models)."""
    import onnx

    from raggedvit.exporter.metadata import read_recipe

    try:
        proto = (
            onnx.load_from_string(model)
            if isinstance(model, bytes)
            else onnx.load(str(model), load_external_data=False)
        )
        return read_recipe(proto)
    except Exception:  # noqa: BLE001 - not a raggedvit export (or unreadable: ORT reports that itself)
        return None


def _onnx_type(t: torch.Tensor) -> int:
    import torch

    types = {
        torch.float32: TensorProto.FLOAT,
        torch.float16: TensorProto.FLOAT16,
        torch.bfloat16: TensorProto.BFLOAT16,
        torch.float64: TensorProto.DOUBLE,
        torch.int32: TensorProto.INT32,
        torch.int64: TensorProto.INT64,
        torch.int8: TensorProto.INT8,
        torch.uint8: TensorProto.UINT8,
        torch.bool: TensorProto.BOOL,
    }
    if t.dtype not in types:
        raise TypeError(f"no ONNX element type for torch dtype {t.dtype}")
    return types[t.dtype]


def bind_tensor(binding: ort.IOBinding, name: str, tensor: torch.Tensor, *, output: bool = False) -> None:
    """Binds a contiguous torch tensor (CPU or CUDA) to input/output `name` without a copy.

    An empty tensor has no data pointer: an empty input is passed as a fresh OrtValue, an empty
    output is left to ORT to allocate (read it from the returned OrtValues).
    """
    if not tensor.is_contiguous():
        raise ValueError(f"{name}: io binding needs a contiguous tensor, got strides {tensor.stride()}")
    device = "cuda" if tensor.is_cuda else "cpu"
    device_id = (tensor.device.index or 0) if tensor.is_cuda else 0
    if tensor.numel() == 0:  # no data pointer to bind: ORT allocates the (empty) value itself
        if output:
            binding.bind_output(name, device, device_id)
        else:
            value = ort.OrtValue.ortvalue_from_shape_and_type(list(tensor.shape), _onnx_type(tensor), device, device_id)
            binding.bind_ortvalue_input(name, value)
        return
    bind = binding.bind_output if output else binding.bind_input
    bind(name, device, device_id, _onnx_type(tensor), list(tensor.shape), tensor.data_ptr())


def run_with_iobinding(
    session: ort.InferenceSession,
    inputs: Mapping[str, torch.Tensor | ort.OrtValue],
    outputs: Mapping[str, torch.Tensor] | Sequence[str] | None = None,
    *,
    output_device: Device = "cuda",
    synchronize_torch: bool = True,
) -> list[ort.OrtValue]:
    """Runs `session` on bound data (no host copies); returns the output OrtValues.

    inputs: name -> torch tensor (CPU/CUDA) or OrtValue. outputs: name -> preallocated torch tensor
    (written in place), or names whose outputs ORT allocates on `output_device` (default: all outputs).
    synchronize_torch waits for pending torch CUDA work first (ORT runs on its own stream).
    """
    import torch

    binding = session.io_binding()
    for name, value in inputs.items():
        if isinstance(value, ort.OrtValue):
            binding.bind_ortvalue_input(name, value)
        else:
            bind_tensor(binding, name, value)
    if outputs is None:
        outputs = [o.name for o in session.get_outputs()]
    if isinstance(outputs, Mapping):
        for name, tensor in outputs.items():
            bind_tensor(binding, name, tensor, output=True)
    else:
        for name in outputs:
            binding.bind_output(name, output_device)
    if synchronize_torch and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    session.run_with_iobinding(binding)
    return list(binding.get_outputs())


class GraphRunner:
    """A raggedvit export run as a CUDA graph at one batch size: one graph launch per call, no per-node host cost.

    Owns static device buffers (images [batch, 3, S, S] float32, logits, token_counts) bound once; ORT captures
    the graph on an early run and replays it afterwards. Only exports whose shapes are static at a given batch
    (capacity-layout exports of every policy; compact ones of topk-l2, evit without fuse, none:
    `raggedvit.exporter.checks.recipe_static_shapes`) can be captured; ORT refuses the session otherwise. Returned
    tensors are the runner's buffers: copy them to keep them past the next call. `benchmarks.serving` runs it
    for fp16-all exports of topk-l2, cls-mass in the capacity layout (with and without RaggedLinear) and policy
    none, at B = 1 to 128.
    """

    def __init__(
        self,
        model: str | Path,
        batch: int,
        *,
        device_id: int = 0,
        warmup: int = 3,
        cuda_options: Mapping[str, str] | None = None,
    ) -> None:
        import torch

        from raggedvit.exporter.checks import recipe_static_shapes
        from raggedvit.exporter.metadata import read_recipe
        from raggedvit.policies import counts_known

        recipe = read_recipe(model)
        prune = recipe.get("prune", {})
        if not recipe_static_shapes(recipe):
            raise ValueError(
                f"{model}: policy {prune.get('policy')!r} keeps data-dependent token counts; its graph cannot be "
                "captured as a CUDA graph (export it with capacity=True / --capacity, or use create_session + "
                "run_with_iobinding)"
            )
        self.session = create_session(
            model,
            "cuda",
            device_id=device_id,
            cuda_graph=True,
            tf32=tf32_for(recipe),
            batch=batch,
            cuda_options=cuda_options,
        )
        dev = torch.device("cuda", device_id)
        s = int(recipe["img_size"])
        stages = (
            len(recipe.get("prune", {}).get("prune_at", ())) if recipe.get("prune", {}).get("policy") != "none" else 0
        )
        first = self.session.get_outputs()[0]  # logits (features for headless models)
        classes = int(first.shape[1])
        self.images = torch.zeros(batch, 3, s, s, dtype=torch.float32, device=dev)
        self.logits = torch.empty(batch, classes, dtype=torch.float32, device=dev)
        # counts known before the data fold into a constant with the batch fixed, which ORT copies into the output
        # on every run: host memory, as a copy into device memory would break the graph capture. Counts computed
        # on the device (capacity exports of cls-mass, evit with fuse) stay there: a device-to-host copy would.
        on_host = counts_known(str(prune.get("policy", "none")), bool(prune.get("fuse", False)))
        self.token_counts = torch.empty(batch, stages, dtype=torch.int64, device=None if on_host else dev)
        self.binding = self.session.io_binding()
        bind_tensor(self.binding, "images", self.images)
        bind_tensor(self.binding, first.name, self.logits, output=True)
        bind_tensor(self.binding, "token_counts", self.token_counts, output=True)
        for _ in range(warmup):  # regular runs, then the capture
            self.replay()

    def replay(self) -> None:
        """Run the graph on the current contents of `self.images` (synchronous)."""
        self.session.run_with_iobinding(self.binding)

    def __call__(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """images [batch, 3, S, S] (any device/dtype) -> (logits [batch, classes] float32,
        token_counts [batch, stages] int64: on the host when the counts are export-time constants, else on the
        device)."""
        import torch

        if tuple(images.shape) != tuple(self.images.shape):
            raise ValueError(f"images: expected shape {tuple(self.images.shape)}, got {tuple(images.shape)}")
        self.images.copy_(images)
        torch.cuda.current_stream(self.images.device).synchronize()  # ORT runs on its own stream
        self.replay()
        return self.logits, self.token_counts
