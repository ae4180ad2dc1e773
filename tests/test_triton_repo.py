"""raggedvit triton-repo: the generated config.pbtxt parses strictly against Triton's model-config schema
(tritonclient's model_config_pb2) and every field matches the model as ONNX Runtime sees it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from google.protobuf import text_format
from onnx import TensorProto, helper

from raggedvit.custom_ops import LIBRARY_NAME, library_path
from raggedvit.triton_repo import model_config, write_model_repository
from tests.support.cli import run_cli
from tests.support.testing import gelu_float64

MODEL = "deit_tiny_patch16_224"
ORT_TO_TRITON = {"tensor(float)": "TYPE_FP32", "tensor(int64)": "TYPE_INT64", "tensor(float16)": "TYPE_FP16"}


def _schema():
    """tritonclient's model_config_pb2, loaded from its file: tritonclient.grpc's __init__ would need grpcio."""
    spec = importlib.util.find_spec("tritonclient")
    assert spec is not None, "needs tritonclient (the dev extra) for Triton's model-config schema"
    path = Path(next(iter(spec.submodule_search_locations))) / "grpc" / "model_config_pb2.py"
    name = "_raggedvit_tests_model_config_pb2"
    if name not in sys.modules:
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


def parse_config(path: Path):
    """ModelConfig from config.pbtxt; text_format.Parse rejects unknown fields and bad enum values."""
    config = _schema().ModelConfig()
    text_format.Parse(path.read_text(), config)
    return config


# one pytest-xdist worker runs this module (`--dist loadgroup`), so its module fixtures run once
pytestmark = pytest.mark.xdist_group("test_triton_repo")


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """A pruned DeiT-Tiny exported as the README does (seeded weights, topk-l2 at block 4)."""
    out = tmp_path_factory.mktemp("triton") / "deit_tiny.onnx"
    res = run_cli("export", MODEL, "--seed", "0", "--policy", "topk-l2", "--prune-at", "4", "-o", str(out))
    assert res.returncode == 0, res.stderr
    return out


def _session(model_path: Path, library: Path):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.register_custom_ops_library(str(library))
    return ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])


def _check_tensors(entries, ort_args, batched: bool) -> None:
    assert [e.name for e in entries] == [a.name for a in ort_args]
    for entry, arg in zip(entries, ort_args):
        assert _schema().DataType.Name(entry.data_type) == ORT_TO_TRITON[arg.type], arg
        shape = [d if isinstance(d, int) else -1 for d in arg.shape]  # ORT: dim_param names for dynamic dims
        assert list(entry.dims) == (shape[1:] if batched else shape), arg


def test_config_matches_the_model(exported, tmp_path):
    repo = tmp_path / "models"
    for name, kind in (("deit", "gpu"), ("deit_cpu", "cpu")):
        res = run_cli("triton-repo", str(exported), str(repo), "--name", name, "--kind", kind, "--instances", "2")
        assert res.returncode == 0, res.stderr
        assert f"wrote {repo / name}" in res.stdout
        config = parse_config(repo / name / "config.pbtxt")
        assert [(g.count, _schema().ModelInstanceGroup.Kind.Name(g.kind)) for g in config.instance_group] == [
            (2, f"KIND_{kind.upper()}")
        ]
    model_dir = repo / "deit"
    config = parse_config(model_dir / "config.pbtxt")
    assert config.name == "deit" and config.platform == "onnxruntime_onnx"
    assert config.max_batch_size == 32 and config.HasField("dynamic_batching")
    # the library is named by its absolute path on the server: /models <-> repo
    (library,) = config.model_operations.op_library_filename
    assert library == f"/models/deit/{LIBRARY_NAME}"
    local_library = repo / Path(library).relative_to("/models")
    assert local_library.read_bytes() == Path(library_path()).read_bytes()
    assert (model_dir / "1" / "model.onnx").read_bytes() == exported.read_bytes()

    # ONNX Runtime, with the repository's copy of the library, agrees with every input and output entry
    sess = _session(model_dir / "1" / "model.onnx", local_library)
    _check_tensors(config.input, sess.get_inputs(), batched=True)
    _check_tensors(config.output, sess.get_outputs(), batched=True)
    assert all(isinstance(a.shape[0], str) for a in [*sess.get_inputs(), *sess.get_outputs()])  # dynamic batch
    images = np.random.default_rng(0).standard_normal((2, *config.input[0].dims), dtype=np.float32)
    outputs = sess.run(None, {config.input[0].name: images})
    assert [list(o.shape) for o in outputs] == [[2, *entry.dims] for entry in config.output]


def _gelu_model(path: Path, shape: list, *, external: bool = False, ragged: bool = True) -> None:
    """com.raggedvit::BiasGelu(x, w) with x of `shape` (str = dynamic dim); w saved beside the model when `external`;
    ragged False: x + w in plain ONNX (a model that needs no op library)."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [4], np.arange(4, dtype=np.float32).tobytes(), raw=True)
    node = (helper.make_node("BiasGelu", ["x", "w"], ["y"], domain="com.raggedvit") if ragged
            else helper.make_node("Add", ["x", "w"], ["y"]))  # fmt: skip
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        [w],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.raggedvit", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    onnx.save(model, str(path), save_as_external_data=external, location="weights.bin", size_threshold=0)


def test_fixed_batch_is_served_unbatched(tmp_path):
    _gelu_model(tmp_path / "fixed.onnx", [2, 4])
    repo = write_model_repository(tmp_path / "fixed.onnx", tmp_path / "repo", max_batch_size=8, kind="cpu")
    config = parse_config(repo.config)
    assert repo.max_batch_size == 0 and config.max_batch_size == 0
    assert not config.HasField("dynamic_batching")
    assert [list(t.dims) for t in [*config.input, *config.output]] == [[2, 4], [2, 4]]


def test_external_data_is_copied(tmp_path):
    _gelu_model(tmp_path / "ext.onnx", ["n", 4], external=True)
    repo = write_model_repository(tmp_path / "ext.onnx", tmp_path / "repo", name="ext")
    assert (repo.model.parent / "weights.bin").read_bytes() == (tmp_path / "weights.bin").read_bytes()
    config = parse_config(repo.config)
    assert config.max_batch_size == 32 and [list(t.dims) for t in config.input] == [[4]]
    y = _session(repo.model, repo.library).run(None, {"x": np.zeros((3, 4), np.float32)})[0]
    gelu = gelu_float64(torch.arange(4, dtype=torch.float64)).numpy()
    np.testing.assert_allclose(y, np.tile(gelu, (3, 1)), rtol=1e-6)


def test_names_are_quoted_for_text_format():
    name = 'in "quotes" \\ and ünïcode\n'
    text = model_config(name, [], [], max_batch_size=0, instances=1, kind="gpu", op_library="/m/a b/lib.so")
    config = _schema().ModelConfig()
    text_format.Parse(text, config)
    assert config.name == name and list(config.model_operations.op_library_filename) == ["/m/a b/lib.so"]


def test_strict_parse_rejects_unknown_fields(tmp_path):
    bad = tmp_path / "config.pbtxt"
    bad.write_text('name: "m"\nplatform: "onnxruntime_onnx"\nmax_batch_sizes: 4\n')
    with pytest.raises(text_format.ParseError, match="max_batch_sizes"):
        parse_config(bad)


def test_cli_errors(tmp_path):
    exported = tmp_path / "m.onnx"
    _gelu_model(exported, ["n", 4])

    def error(*args: str) -> str:
        res = run_cli("triton-repo", *args)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), res.stderr
        return lines[0]

    assert "does not exist" in error(str(tmp_path / "missing.onnx"), str(tmp_path / "r"))
    (tmp_path / "notes.txt").write_text("not a model")
    assert "is not an ONNX model" in error(str(tmp_path / "notes.txt"), str(tmp_path / "r"))
    assert "must be absolute" in error(str(exported), str(tmp_path / "r"), "--server-repo", "models")
    assert "not a folder name" in error(str(exported), str(tmp_path / "r"), "--name", "a/b")
    _gelu_model(tmp_path / "plain.onnx", ["n", 4], ragged=False)
    assert ("plain.onnx has no com.raggedvit op, so it needs no op library: serve it with Triton's onnxruntime backend"
            in error(str(tmp_path / "plain.onnx"), str(tmp_path / "r")))  # fmt: skip
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())  # nothing half-written
    (tmp_path / "r" / "m").mkdir(parents=True)
    assert "already exists" in error(str(exported), str(tmp_path / "r"))
    assert "Invalid value for '--kind'" in error(str(exported), str(tmp_path / "r"), "--kind", "tpu")
