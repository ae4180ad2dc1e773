"""ONNX Runtime sessions and io-bound runs on torch tensors (CUDA EP with data on the GPU, or CPU EP)."""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort
import torch

from raggedvit.runtime import bind_tensor, create_session, providers_for, session_options

__all__ = ["BoundRun", "baseline_session", "ragged_session"]

_TORCH_TYPES = {
    "tensor(float)": torch.float32,
    "tensor(float16)": torch.float16,
    "tensor(bfloat16)": torch.bfloat16,
    "tensor(int64)": torch.int64,
    "tensor(int32)": torch.int32,
}


def baseline_session(
    path: Path, device: str, *, profile_prefix: str | None = None, cuda_graph: bool = False
) -> ort.InferenceSession:
    """A plain session (no custom op library) on `device` ("cuda": CUDA EP then CPU EP; cuda_graph: replayed)."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if profile_prefix:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    # tf32 on: ORT's default, the baselines run as users run them
    return ort.InferenceSession(str(path), so, providers=providers_for(device, cuda_graph=cuda_graph, tf32=True))


def ragged_session(
    path: Path, device: str, *, profile_prefix: str | None = None, cuda_graph: bool = False
) -> ort.InferenceSession:
    """raggedvit.runtime.create_session with libraggedvit_ort.so registered (optionally profiling / CUDA graph)."""
    so = session_options()
    if profile_prefix:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    return create_session(path, device, options=so, cuda_graph=cuda_graph)


class BoundRun:
    """`session` bound once to `images` [B, 3, S, S] and to preallocated torch outputs on the same device.

    run() executes the session (the timed call); outputs() returns name -> torch tensor after a run.
    Outputs whose shape is not [batch, fixed...] are left to ORT to allocate and copied out in outputs().
    """

    def __init__(self, session: ort.InferenceSession, images: torch.Tensor) -> None:
        self.session = session
        self.binding = session.io_binding()
        (inp,) = session.get_inputs()
        want = _TORCH_TYPES.get(inp.type, torch.float32)
        self.images = images.to(want).contiguous()  # kept alive: the binding holds its pointer
        bind_tensor(self.binding, inp.name, self.images)
        self._out: dict[str, torch.Tensor | None] = {}
        B = images.shape[0]
        device_type = "cuda" if images.is_cuda else "cpu"
        for o in session.get_outputs():
            dims = list(o.shape)
            fixed = all(isinstance(d, int) for d in dims[1:]) and o.type in _TORCH_TYPES
            if fixed:
                shape = [B, *dims[1:]]
                t = torch.empty(shape, dtype=_TORCH_TYPES[o.type], device=images.device)
                bind_tensor(self.binding, o.name, t, output=True)
                self._out[o.name] = t if t.numel() else None
            else:
                self.binding.bind_output(o.name, device_type, images.device.index or 0)
                self._out[o.name] = None

    def run(self) -> None:
        self.session.run_with_iobinding(self.binding)

    def outputs(self) -> dict[str, torch.Tensor]:
        """name -> torch tensor (on images' device for preallocated outputs, CPU for ORT-allocated ones)."""
        values = self.binding.get_outputs()
        res = {}
        for (name, t), v in zip(self._out.items(), values):
            res[name] = t if t is not None else torch.from_numpy(v.numpy())
        return res
