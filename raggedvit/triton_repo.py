"""A Triton Inference Server model repository for an exported model (onnxruntime backend + the op library).

    write_model_repository("deit.onnx", "models", name="deit", max_batch_size=32, kind="gpu")

writes

    models/deit/config.pbtxt             platform "onnxruntime_onnx", inputs/outputs from the graph,
                                         dynamic batching, instance group, model_operations
    models/deit/1/model.onnx             (and its external data files, if any)
    models/deit/libraggedvit_ort.so      the op library that config.pbtxt registers

Triton's onnxruntime backend hands op_library_filename to ONNX Runtime as written (dlopen): a relative path
would resolve against the server's working directory, so the config names the library by its absolute path
as the server sees the repository (`server_repo`, "/models" for `docker run -v $PWD/models:/models`).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto

from raggedvit.custom_ops import LIBRARY_NAME, library_path
from raggedvit.exporter.files import external_data_files
from raggedvit.exporter.metadata import RAGGED_DOMAIN
from raggedvit.outputs import commit, staging_dir

__all__ = ["ModelRepository", "TensorConfig", "model_config", "tensor_configs", "write_model_repository"]

Kind = Literal["gpu", "cpu"]

TRITON_TYPES = {
    TensorProto.BOOL: "TYPE_BOOL",
    TensorProto.UINT8: "TYPE_UINT8",
    TensorProto.UINT16: "TYPE_UINT16",
    TensorProto.UINT32: "TYPE_UINT32",
    TensorProto.UINT64: "TYPE_UINT64",
    TensorProto.INT8: "TYPE_INT8",
    TensorProto.INT16: "TYPE_INT16",
    TensorProto.INT32: "TYPE_INT32",
    TensorProto.INT64: "TYPE_INT64",
    TensorProto.FLOAT16: "TYPE_FP16",
    TensorProto.FLOAT: "TYPE_FP32",
    TensorProto.DOUBLE: "TYPE_FP64",
    TensorProto.STRING: "TYPE_STRING",
    TensorProto.BFLOAT16: "TYPE_BF16",
}


@dataclass(frozen=True)
class TensorConfig:
    """One model input or output: name, Triton data type, and its full ONNX shape (-1 for a dynamic dim)."""

    name: str
    data_type: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ModelRepository:
    """What write_model_repository wrote."""

    model_dir: Path
    config: Path
    model: Path
    library: Path
    max_batch_size: int  # 0 when the model's batch dimension is fixed (no batching by Triton)


def tensor_configs(model: onnx.ModelProto) -> tuple[list[TensorConfig], list[TensorConfig]]:
    """(inputs, outputs) of the graph; ValueError for a tensor type Triton has no data type for."""
    initializers = {t.name for t in model.graph.initializer}

    def configs(values) -> list[TensorConfig]:
        out = []
        for v in values:
            if v.name in initializers:  # IR < 4 lists initializers as graph inputs
                continue
            t = v.type.tensor_type
            if not v.type.HasField("tensor_type") or t.elem_type not in TRITON_TYPES:
                raise ValueError(f"tensor {v.name!r}: Triton has no data type for {onnx.helper.printable_type(v.type)}")
            shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim)
            out.append(TensorConfig(v.name, TRITON_TYPES[t.elem_type], shape))
        return out

    return configs(model.graph.input), configs(model.graph.output)


def _batchable(tensors: list[TensorConfig]) -> bool:
    """Triton batches a model whose every input and output has a dynamic first dimension."""
    return all(t.shape and t.shape[0] == -1 for t in tensors)


def _quote(text: str) -> str:
    """A protobuf text-format string literal (octal escapes for anything but printable ASCII)."""
    body = "".join(chr(b) if 0x20 <= b < 0x7F and b not in (0x22, 0x5C) else f"\\{b:03o}" for b in text.encode("utf-8"))
    return f'"{body}"'


def model_config(
    name: str,
    inputs: list[TensorConfig],
    outputs: list[TensorConfig],
    *,
    max_batch_size: int,
    instances: int,
    kind: Kind,
    op_library: str,
) -> str:
    """config.pbtxt text; with max_batch_size > 0 the dims leave out the batch dimension (the first)."""
    skip = 1 if max_batch_size > 0 else 0

    def tensors(field: str, items: list[TensorConfig]) -> list[str]:
        entries = [
            f"  {{\n    name: {_quote(t.name)}\n    data_type: {t.data_type}\n"
            f"    dims: [ {', '.join(map(str, t.shape[skip:]))} ]\n  }}"
            for t in items
        ]
        return [f"{field} [", ",\n".join(entries), "]"]

    lines = [
        f"name: {_quote(name)}",
        'platform: "onnxruntime_onnx"',
        f"max_batch_size: {max_batch_size}",
        *tensors("input", inputs),
        *tensors("output", outputs),
    ]
    if max_batch_size > 0:
        lines.append("dynamic_batching { }")
    lines += [
        f"instance_group [\n  {{\n    count: {instances}\n    kind: KIND_{kind.upper()}\n  }}\n]",
        f"model_operations {{\n  op_library_filename: {_quote(op_library)}\n}}",
    ]
    return "\n".join(lines) + "\n"


def _uses_ragged_ops(model: onnx.ModelProto) -> bool:
    """Whether any node of the model (its graph, subgraphs or functions) is a com.raggedvit op."""

    def graph_uses(graph: onnx.GraphProto) -> bool:
        for node in graph.node:
            if node.domain == RAGGED_DOMAIN:
                return True
            subgraphs = [a.g for a in node.attribute if a.HasField("g")] + [g for a in node.attribute for g in a.graphs]
            if any(graph_uses(g) for g in subgraphs):
                return True
        return False

    return graph_uses(model.graph) or any(n.domain == RAGGED_DOMAIN for f in model.functions for n in f.node)


def write_model_repository(
    onnx_path: str | Path,
    repo_dir: str | Path,
    *,
    name: str | None = None,
    max_batch_size: int = 32,
    instances: int = 1,
    kind: Kind = "gpu",
    server_repo: str = "/models",
    library: str | Path | None = None,
) -> ModelRepository:
    """Write repo_dir/<name>/ (config.pbtxt, 1/model.onnx, the op library) for the exported model `onnx_path`.

    name: model name and folder (default: the file's stem). max_batch_size: the largest batch Triton forms
    (dynamic batching); 0, or a model whose batch dimension is fixed, serves the model's own shapes unbatched.
    kind: "gpu" (KIND_GPU instances: CUDA EP) or "cpu". server_repo: absolute path of repo_dir as the server
    sees it. library: the op library to copy (default: raggedvit.custom_ops.library_path()).
    ValueError for bad arguments, a missing or unreadable model, a model with no com.raggedvit op (it needs no op
    library), a model Triton cannot describe, or an existing repo_dir/<name>; OpLibraryNotBuilt if there is no
    library to copy.
    """
    onnx_path, repo_dir = Path(onnx_path), Path(repo_dir)
    name = onnx_path.stem if name is None else name
    if not name or name in (".", "..") or any(c in name for c in "/\\\0"):
        raise ValueError(f"model name {name!r} is not a folder name")
    if max_batch_size < 0 or instances < 1:
        raise ValueError(f"need max_batch_size >= 0 and instances >= 1, got {max_batch_size} and {instances}")
    if kind not in ("gpu", "cpu"):
        raise ValueError(f"kind must be 'gpu' or 'cpu', got {kind!r}")
    if not PurePosixPath(server_repo).is_absolute():
        raise ValueError(
            f"the repository's path on the server must be absolute (Triton dlopens the library as named): {server_repo}"
        )
    target = repo_dir / name
    if target.exists():
        raise ValueError(f"{str(target)!r} already exists")
    library = Path(library) if library is not None else Path(library_path())
    if not onnx_path.is_file():
        raise ValueError(f"model file {str(onnx_path)!r} does not exist")
    try:
        model = onnx.load(str(onnx_path), load_external_data=False)
    except DecodeError:
        raise ValueError(f"{str(onnx_path)!r} is not an ONNX model") from None
    if not _uses_ragged_ops(model):
        raise ValueError(
            f"{onnx_path.name} has no {RAGGED_DOMAIN} op, so it needs no op library: serve it with Triton's "
            "onnxruntime backend as it is (DIR/NAME/config.pbtxt and DIR/NAME/1/model.onnx), or give a raggedvit export"
        )
    inputs, outputs = tensor_configs(model)
    external = external_data_files(model, onnx_path)
    if not _batchable(inputs + outputs):
        max_batch_size = 0
    config = model_config(
        name,
        inputs,
        outputs,
        max_batch_size=max_batch_size,
        instances=instances,
        kind=kind,
        op_library=str(PurePosixPath(server_repo) / name / LIBRARY_NAME),
    )

    repo_dir.mkdir(parents=True, exist_ok=True)
    with staging_dir(repo_dir, name) as tmp:  # renamed into place when complete
        staging = tmp / name
        (staging / "1").mkdir(parents=True)
        shutil.copyfile(onnx_path, staging / "1" / "model.onnx")
        for rel in external:
            (staging / "1" / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(onnx_path.parent / rel, staging / "1" / rel)
        shutil.copyfile(library, staging / LIBRARY_NAME)
        (staging / "config.pbtxt").write_text(config)
        staging.chmod(0o755)
        commit({staging: target})
    return ModelRepository(
        model_dir=target,
        config=target / "config.pbtxt",
        model=target / "1" / "model.onnx",
        library=target / LIBRARY_NAME,
        max_batch_size=max_batch_size,
    )
