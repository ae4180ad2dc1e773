"""Writing an exported model: strip the exporting machine's metadata, check it, and rename the `.onnx` (and its data
file, for large weights) into place as a pair (raggedvit.outputs). Torch-free."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import onnx_ir as ir

from raggedvit.exporter.files import external_data_name
from raggedvit.exporter.metadata import strip_local_metadata
from raggedvit.outputs import commit, open_file_mode, staging_dir

__all__ = ["EXTERNAL_DATA_BYTES", "save_model"]

EXTERNAL_DATA_BYTES = 1 << 30  # models with more initializer bytes keep their weights in a .data file beside them


def save_model(model: ir.Model, path: str | Path) -> Path:
    """Strip the exporting machine's metadata (strip_local_metadata, in place), check (onnx.checker, full) and write
    `model` to `path` atomically (staging_dir); weights over EXTERNAL_DATA_BYTES go to a data file beside it
    (files.external_data_name: `path`.data). The two are renamed into place as a pair (commit: one writer at a time
    per folder). Nothing is left at `path` (or beside it) if anything fails or a signal arrives."""
    path = Path(path)
    size = sum(v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None)
    data_name = external_data_name(path) if size > EXTERNAL_DATA_BYTES else None
    with staging_dir(path.parent, path.name) as tmp:
        staged = tmp / path.name
        strip_local_metadata(model)
        ir.save(model, staged, external_data=data_name)
        onnx.checker.check_model(str(staged), full_check=True)
        mode = open_file_mode()
        for f in tmp.iterdir():
            os.chmod(f, mode)
        moves = {staged: path}
        if data_name is not None:
            moves = {tmp / data_name: path.parent / data_name, **moves}
        commit(moves)
    return path
