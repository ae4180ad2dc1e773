"""The files of an exported model: the `.onnx` and, for weights over the external-data threshold, its data file.

Torch-free (triton-repo and the CLI read it without tracing anything).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import onnx
from onnx import TensorProto

from raggedvit.outputs import name_max

__all__ = ["DATA_SUFFIX", "external_data_files", "external_data_name", "model_files"]

DATA_SUFFIX = ".data"


_WRITER_TEMP = 10  # onnx_ir writes the data file as .NAME.<8 random>/NAME first (tempfile.mkdtemp): 10 bytes more


def external_data_name(path: str | Path) -> str:
    """The name of the weights file written beside the model `path`: NAME.data, or, where that leaves the writer's
    temp name (NAME + 10 bytes) past the folder's file name limit, NAME cut short + "-" + 8 hex digits of NAME's
    sha256 + ".data" (so every legal model name has one, and two long names that share a beginning get two)."""
    path = Path(path)
    name = f"{path.name}{DATA_SUFFIX}"
    limit = name_max(path.parent) - _WRITER_TEMP
    if len(os.fsencode(name)) <= limit:
        return name
    tag = f"-{hashlib.sha256(os.fsencode(path.name)).hexdigest()[:8]}{DATA_SUFFIX}"
    return os.fsencode(path.name)[: limit - len(tag)].decode("utf-8", "ignore") + tag


def _tensors(graph: onnx.GraphProto) -> Iterator[TensorProto]:
    """Initializers and tensor attributes of `graph` and its subgraphs."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            yield from ([attr.t] if attr.HasField("t") else []) + list(attr.tensors)
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from _tensors(sub)


def external_data_files(model: onnx.ModelProto, model_path: str | Path) -> list[str]:
    """Relative locations (sorted) of the external data files of `model`, loaded from `model_path` without its data;
    ValueError if one is not a file beside the model (absolute, outside its folder, or missing)."""
    model_path = Path(model_path)
    files = set()
    for tensor in _tensors(model.graph):
        if tensor.data_location != TensorProto.EXTERNAL:
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        rel = PurePosixPath(location.replace("\\", "/"))
        if not location or rel.is_absolute() or ".." in rel.parts or not (model_path.parent / rel).is_file():
            raise ValueError(f"external data {location!r} of tensor {tensor.name!r} is not a file beside the model")
        files.add(str(rel))
    return sorted(files)


def model_files(path: str | Path) -> list[Path]:
    """The model file `path` and the external data files it references (ValueError as external_data_files)."""
    path = Path(path)
    model = onnx.load(str(path), load_external_data=False)
    return [path, *(path.parent / rel for rel in external_data_files(model, path))]
