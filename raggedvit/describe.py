"""Self-describing exports: producer fields and a doc_string that say how to load the model, and recipes
without local paths.

    describe_model(model)          # producer_name/version; doc_string: the op library and how to register it
    recipe = scrub_paths(recipe)   # absolute local paths -> file names (before write_recipe)
    local_paths(recipe)            # ["weights.checkpoint_path", ...]: where absolute paths remain
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any

import onnx

import raggedvit
from raggedvit.custom_ops import LIBRARY_NAME

__all__ = ["PRODUCER_NAME", "describe_model", "doc_string", "local_paths", "scrub_paths"]

PRODUCER_NAME = "raggedvit"

_DOC = """\
Exported by raggedvit {version}. It uses the custom operator
com.raggedvit::RaggedAttention, so ONNX Runtime needs raggedvit's op library {lib} registered before the
session is created; without it, session creation fails with "RaggedAttention ... is not a registered function/op".

Python (the raggedvit wheel carries the library; install it with the extra "cpu" or "gpu" for ONNX Runtime):
    import onnxruntime as ort, raggedvit.custom_ops
    so = ort.SessionOptions()
    so.register_custom_ops_library(raggedvit.custom_ops.library_path())
    sess = ort.InferenceSession("model.onnx", so, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])

C/C++ (the library's path: python -c "import raggedvit.custom_ops as c; print(c.library_path())"):
    Ort::SessionOptions so;
    so.RegisterCustomOpsLibrary(ORT_TSTR("/path/to/{lib}"));  // C API: OrtApi::RegisterCustomOpsLibrary_V2
    Ort::Session session(env, ORT_TSTR("model.onnx"), so);

Triton Inference Server: `raggedvit triton-repo model.onnx DIR` writes a model repository whose config.pbtxt
registers the library (model_operations {{ op_library_filename: ... }}).
"""


def doc_string() -> str:
    """The ModelProto.doc_string of raggedvit exports: the op library, and how to register it."""
    return _DOC.format(version=raggedvit.__version__, lib=LIBRARY_NAME)


def describe_model(model: onnx.ModelProto) -> None:
    """Set producer_name "raggedvit", producer_version (raggedvit.__version__) and doc_string() on `model`."""
    model.producer_name = PRODUCER_NAME
    model.producer_version = raggedvit.__version__
    model.doc_string = doc_string()


def _is_local_path(value: str) -> bool:
    """An absolute path on this or another machine: /x, ~/x, file:///x, C:\\x, \\\\server\\x."""
    if value.startswith(("~/", "~\\", "file:")):
        return True
    return PurePosixPath(value).is_absolute() or PureWindowsPath(value).is_absolute()


def _name(value: str) -> str:
    path = re.sub(r"^file:(//)?", "", value)
    return PureWindowsPath(path).name if "\\" in path else PurePosixPath(path).name


def local_paths(recipe: Any, _prefix: str = "") -> list[str]:
    """Dotted keys of the strings in `recipe` (nested dicts and lists) that are absolute local paths."""
    found: list[str] = []
    items = recipe.items() if isinstance(recipe, dict) else enumerate(recipe) if isinstance(recipe, list) else ()
    for key, value in items:
        where = f"{_prefix}{key}"
        if isinstance(value, str) and _is_local_path(value):
            found.append(where)
        elif isinstance(value, dict | list):
            found.extend(local_paths(value, where + "."))
    return found


def scrub_paths(recipe: Any) -> Any:
    """A copy of `recipe` whose absolute local paths are replaced by their file names ("/home/u/w.pth" -> "w.pth").

    Exports then reveal no user name or directory layout and describe the same weights on any machine (the
    weights' sha256 still identifies them); validation finds such a checkpoint through --checkpoint FILE."""
    if isinstance(recipe, dict):
        return {key: scrub_paths(value) for key, value in recipe.items()}
    if isinstance(recipe, list):
        return [scrub_paths(value) for value in recipe]
    if isinstance(recipe, str) and _is_local_path(recipe):
        return _name(recipe)
    return recipe
