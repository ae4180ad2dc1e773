"""Self-describing exports: describe_model's fields, its doc_string's Python recipe run as written, and
recipes without absolute local paths."""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import raggedvit
from raggedvit.custom_ops import LIBRARY_NAME
from raggedvit.describe import describe_model, doc_string, local_paths, scrub_paths


def _ragged_model() -> onnx.ModelProto:
    """One RaggedAttention node: qkv [T, 3*H*D] float, cu_seqlens [B+1] int64 -> out [T, H*D] (H=1, D=16)."""
    node = helper.make_node("RaggedAttention", ["qkv", "cu"], ["out"], domain="com.raggedvit", num_heads=1)
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("qkv", TensorProto.FLOAT, ["T", 48]),
            helper.make_tensor_value_info("cu", TensorProto.INT64, ["B1"]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["T", 16])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.raggedvit", 1)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="someone else")
    model.ir_version = 10
    return model


def test_describe_model_sets_producer_and_doc(tmp_path):
    model = _ragged_model()
    describe_model(model)
    onnx.save(model, str(tmp_path / "m.onnx"))
    loaded = onnx.load(str(tmp_path / "m.onnx"))
    onnx.checker.check_model(loaded)
    assert loaded.producer_name == "raggedvit" and loaded.producer_version == raggedvit.__version__
    doc = loaded.doc_string
    assert doc == doc_string()
    for needed in (
        LIBRARY_NAME,
        "com.raggedvit::RaggedAttention",
        "so.register_custom_ops_library(raggedvit.custom_ops.library_path())",
        "RegisterCustomOpsLibrary(",
        "RegisterCustomOpsLibrary_V2",
        "raggedvit triton-repo",
    ):
        assert needed in doc, needed


@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider' is not in available provider names")
def test_doc_string_python_recipe_runs(tmp_path, monkeypatch):
    """The doc_string's Python lines, run as written, give a working session; without them it fails as it says."""
    model = _ragged_model()
    describe_model(model)
    onnx.save(model, str(tmp_path / "model.onnx"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Exception, match="is not a registered function/op"):
        ort.InferenceSession("model.onnx", providers=["CPUExecutionProvider"])
    block = model.doc_string.split("Python", 1)[1].split("\n\n", 1)[0]
    code = "\n".join(line[4:] for line in block.splitlines() if line.startswith("    "))
    assert "register_custom_ops_library" in code
    scope: dict = {}
    exec(code, scope)  # noqa: S102 - the documented recipe itself
    qkv = np.random.default_rng(0).standard_normal((5, 48), dtype=np.float32)
    (out,) = scope["sess"].run(None, {"qkv": qkv, "cu": np.array([0, 2, 5])})
    assert out.shape == (5, 16) and np.isfinite(out).all()


def test_scrub_paths():
    recipe = {
        "model": "deit_tiny_patch16_224",
        "weights": {
            "checkpoint": "w.pth",
            "checkpoint_path": "/home/alice/ckpt/w.pth",
            "others": ["C:\\Users\\bob\\w.bin", "~/w.pt", "file:///data/w.safetensors", "rel/dir/w.pth"],
            "seed": 0,
            "sha": None,
        },
        "url": "https://example.com/w.pth",
    }
    assert local_paths(recipe) == [
        "weights.checkpoint_path",
        "weights.others.0",
        "weights.others.1",
        "weights.others.2",
    ]
    clean = scrub_paths(recipe)
    assert local_paths(clean) == []
    assert clean["weights"]["checkpoint_path"] == "w.pth"
    assert clean["weights"]["others"] == ["w.bin", "w.pt", "w.safetensors", "rel/dir/w.pth"]
    assert clean["url"] == recipe["url"] and clean["weights"]["seed"] == 0 and clean["weights"]["sha"] is None
    assert recipe["weights"]["checkpoint_path"] == "/home/alice/ckpt/w.pth"  # the input is not modified


def test_doc_string_names_no_local_path():
    assert not re.search(r"/(home|root|work|tmp)/", doc_string())
