"""An ONNX Runtime session for an exported model with the raggedvit op library registered."""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort

from raggedvit.validators.errors import OpLibraryMissing, ValidationInputError

__all__ = ["open_session"]


def open_session(
    model_path: str | Path | bytes,
    device: str = "cpu",
    *,
    recipe: dict | None = None,
    intra_op_threads: int | None = None,
) -> ort.InferenceSession:
    """InferenceSession on the CPU EP (device "cpu") or CUDA EP (device "cuda", no silent CPU fallback) of a model
    file, or of a serialized model (bytes: the copy with marked block outputs).

    recipe: the model's raggedvit recipe when the caller has read it (spares create_session reading it again).
    intra_op_threads: ORT's intra-op thread count (None: ORT's default, one per physical core)."""
    from raggedvit.custom_ops import OpLibraryNotBuilt, library_path

    if device not in ("cpu", "cuda"):
        raise ValidationInputError(f"device must be cpu or cuda, got {device!r}")
    try:
        lib = library_path()
    except OpLibraryNotBuilt as e:
        raise OpLibraryMissing(f"raggedvit op library missing: {e}") from None
    if device == "cuda" and "CUDAExecutionProvider" not in ort.get_available_providers():
        raise ValidationInputError("device cuda requested but this onnxruntime has no CUDAExecutionProvider")
    try:
        from raggedvit.runtime import create_session, tf32_for
    except ImportError:
        create_session = None
    try:
        if create_session is not None:
            tf32 = None if recipe is None else device == "cuda" and tf32_for(recipe)
            return _create(create_session, _source(model_path), device, tf32, intra_op_threads)
        opts = ort.SessionOptions()
        opts.register_custom_ops_library(lib)
        if intra_op_threads is not None:
            opts.intra_op_num_threads = intra_op_threads
        providers = ["CUDAExecutionProvider"] if device == "cuda" else ["CPUExecutionProvider"]
        return ort.InferenceSession(_source(model_path), opts, providers=providers)
    except (OSError, RuntimeError) as e:
        if "raggedvit" in str(e) or "custom op" in str(e).lower() or "library" in str(e).lower():
            raise OpLibraryMissing(f"cannot load the raggedvit op library {lib}: {str(e).splitlines()[0]}") from None
        raise
    except Exception as e:
        if type(e).__module__.startswith("onnxruntime"):  # e.g. an op no registered library implements
            first = " ".join(str(e).split())[:400]
            if "Failed to load library" in first:  # ORT's Fail from register_custom_ops_library
                raise OpLibraryMissing(f"cannot load the raggedvit op library {lib}: {first}") from None
            name = "the model" if isinstance(model_path, bytes) else Path(model_path).name
            raise ValidationInputError(f"ONNX Runtime cannot load {name}: {first}") from None
        raise


def _create(
    create_session, source: str | bytes, device: str, tf32: bool | None, threads: int | None
) -> ort.InferenceSession:
    """On CUDA, CPU fallback disabled: a node with no CUDA EP kernel is an input error that names it. Shape arithmetic
    that ORT itself moves to the CPU (every node has a kernel) is allowed, as a session of a fixed batch folds it."""
    if device != "cuda":
        return create_session(source, device=device, tf32=tf32, intra_op_threads=threads)
    from raggedvit.runtime import CudaPlacementError

    try:
        return create_session(source, device=device, tf32=tf32, disable_cpu_fallback=True, intra_op_threads=threads)
    except CudaPlacementError as e:
        if e.unplaced:
            raise ValidationInputError(f"the export cannot run on the CUDA EP: {e}") from None
    return create_session(source, device=device, tf32=tf32, intra_op_threads=threads)


def _source(model: str | Path | bytes) -> str | bytes:
    return model if isinstance(model, bytes) else str(model)
