"""raggedvit.serving.predictor and options, without Ray: a replica's answers equal a direct ONNX Runtime run of the
same images (preprocessed the way validate does), top-5 is the softmax's, an unloadable op library is named, bad
settings are refused."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch

from raggedvit.serving.options import ServeInputError, ServeOptions, graph_batch_sizes
from raggedvit.serving.predictor import Predictor, top5
from raggedvit.serving.server import local_options

MODEL = "deit_tiny_patch16_224"

pytestmark = pytest.mark.xdist_group("serving_predictor")


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    """A depth-3 seeded deit_tiny, topk-l2 keeping 0.5 at block 1 (its recipe names the timm model: the transform)."""
    from raggedvit.exporter import export_onnx
    from raggedvit.pruning import PruneSpec
    from tests.pruning._pruning_models import get_model

    out = tmp_path_factory.mktemp("serving") / "tiny.onnx"
    spec = PruneSpec("topk-l2", (1,), keep=0.5)
    return Path(export_onnx(get_model("deit_tiny_d3"), spec, out, recipe={"model": MODEL}))


@pytest.fixture(scope="module")
def bodies() -> list[bytes]:
    from raggedvit.images import sample_images

    out = []
    for i, (_, im) in enumerate(sample_images()[:3]):
        buf = io.BytesIO()
        im.save(buf, ("JPEG", "PNG", "WEBP")[i])
        out.append(buf.getvalue())
    return out


def test_answers_equal_a_direct_run(export, bodies):
    from raggedvit.images import decode_image, meta_model, preprocess
    from raggedvit.runtime import create_session

    predictor = Predictor(export, ServeOptions(threads=1))
    x = np.stack([predictor.prepare(b, "image/jpeg") for b in bodies])
    answers = predictor.predict(x)

    images = preprocess([decode_image(b) for b in bodies], meta_model(MODEL, 224)).numpy()
    assert np.array_equal(x, images)  # the export's recipe: timm's eval transform of its model
    logits, counts = create_session(export, "cpu").run(None, {"images": images})
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    for a, row, c in zip(answers, p, counts):
        assert a["model"] == "tiny" and a["token_counts"] == [int(v) for v in c] == [99]  # cls + ceil(0.5 x 196)
        assert [k for k, _ in a["top5"]] == list(np.argsort(-row, kind="stable")[:5])
        assert np.allclose([q for _, q in a["top5"]], np.sort(row)[::-1][:5], atol=1e-6)
    one = predictor.predict(x[1:2])[0]  # alone, the same answer as in the batch
    assert one["top5"][0][0] == answers[1]["top5"][0][0] and one["token_counts"] == answers[1]["token_counts"]


def test_top5_orders_by_probability_then_index():
    ranked = top5(np.array([0.0, 2.0, 2.0, -1.0, 1.0, 3.0, 0.0]))
    assert [k for k, _ in ranked] == [5, 1, 2, 4, 0]
    assert np.isclose(sum(q for _, q in top5(np.zeros(5))), 1.0)
    with pytest.raises(ValueError, match="non-finite logits"):
        top5(np.array([1.0, np.nan]))


def test_a_non_finite_image_does_not_fail_its_batch(export, monkeypatch):
    predictor = Predictor(export, ServeOptions(threads=1))
    logits = np.zeros((2, 1000), np.float32)
    logits[0, 3] = np.inf
    monkeypatch.setattr(predictor, "run", lambda images: (logits, np.array([[99], [99]])))
    first, second = predictor.predict(np.zeros((2, 3, 224, 224), np.float32))
    assert isinstance(first, ValueError) and second["top5"][0][1] == pytest.approx(1e-3)


def test_unloadable_op_library_is_named(export, tmp_path, monkeypatch):
    from raggedvit.validators.errors import OpLibraryMissing

    bad = tmp_path / "libbroken.so"
    bad.write_text("not a shared library")
    monkeypatch.setenv("RAGGEDVIT_ORT_LIBRARY", str(bad))
    with pytest.raises(OpLibraryMissing, match=f"cannot load the raggedvit op library {bad}"):
        Predictor(export)


def test_not_an_export_is_refused(tmp_path):
    from raggedvit.validators.errors import ValidationInputError

    (tmp_path / "x.onnx").write_bytes(b"not onnx")
    with pytest.raises(ValidationInputError, match="not a readable ONNX model"):
        Predictor(tmp_path / "x.onnx")


@pytest.mark.parametrize(
    "kwargs,fragment",
    [
        ({"device": "tpu"}, "device must be"),
        ({"replicas": 0}, "replicas must be an integer >= 1"),
        ({"max_batch_size": 0}, "max_batch_size must be"),
        ({"batch_wait_ms": -1.0}, "batch_wait_ms must be >= 0"),
        ({"batch_wait_ms": float("nan")}, "batch_wait_ms must be >= 0"),
        ({"threads": 0}, "threads must be"),
        ({"gpus_per_replica": 0.0}, "gpus_per_replica must be in (0, 1]"),
        ({"name": "a/b"}, "is not a model name"),
        ({"graph_batches": (1, 2)}, "reaching max_batch_size 32"),
    ],
)
def test_bad_options_are_refused(kwargs, fragment):
    with pytest.raises(ServeInputError) as err:
        ServeOptions(**kwargs)
    assert fragment in str(err.value)


def test_batch_sizes_and_local_resources():
    assert graph_batch_sizes(32) == (1, 2, 4, 8, 16, 32) and graph_batch_sizes(12) == (1, 2, 4, 8, 12)
    assert graph_batch_sizes(1) == (1,)
    assert ServeOptions(max_batch_size=8, graph_batches=(8, 1, 1)).batch_sizes == (1, 8)
    assert ServeOptions(max_batch_size=64).max_ongoing_requests == 128
    assert local_options(ServeOptions(replicas=2), cpus=2).actor_options() == {"num_cpus": 1}
    assert local_options(ServeOptions(replicas=3), cpus=2).threads == 1
    assert local_options(ServeOptions(), cpus=8).threads == 8
    cuda = local_options(ServeOptions(device="cuda", replicas=4), gpus=1)
    assert cuda.actor_options() == {"num_cpus": 1, "num_gpus": 0.25}


def test_app_refuses_unknown_options_and_missing_files(export, tmp_path):
    pytest.importorskip("ray.serve")
    from raggedvit.serving import app

    with pytest.raises(ServeInputError, match="unexpected keyword argument 'batch'"):
        app(export, batch=8)
    with pytest.raises(ServeInputError, match="does not exist"):
        app(tmp_path / "none.onnx")
    application = app(export, replicas=2, max_batch_size=8)
    assert type(application).__name__ == "Application"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graphs_answer_as_the_cpu_does(export, bodies):
    """A static-shape export on CUDA runs as CUDA graphs at the captured sizes: a batch of 3 runs padded to 4, its
    answers the CPU EP's (top-1 and token counts; probabilities within fp32 GEMM differences)."""
    cpu = Predictor(export, ServeOptions(threads=1))
    cuda = Predictor(export, ServeOptions(device="cuda", max_batch_size=4))
    assert sorted(cuda.runners) == [1, 2, 4]
    x = np.stack([cpu.prepare(b, None) for b in bodies])
    for a, b in zip(cpu.predict(x), cuda.predict(x)):
        assert a["top5"][0][0] == b["top5"][0][0] and a["token_counts"] == b["token_counts"]
        assert abs(a["top5"][0][1] - b["top5"][0][1]) < 1e-3


def test_a_replica_failure_is_one_line_naming_its_error():
    from raggedvit.serving.server import _start_error

    failure = RuntimeError(
        "Deploying application deit failed: Failed to update the deployments ['RaggedViT'].\n"
        'Traceback (most recent call last):\n  File "/x/replica.py", line 1, in init\n'
        "ray.exceptions.RayTaskError(OpLibraryMissing): ray::ServeReplica:deit:RaggedViT.initialize()\n"
        "raggedvit.validators.errors.OpLibraryMissing: cannot load the raggedvit op library /lib/x.so: bad ELF\n"
    )
    message = str(_start_error(failure))
    assert message == (
        "the application did not start: raggedvit.validators.errors.OpLibraryMissing: cannot load the raggedvit op "
        "library /lib/x.so: bad ELF"
    )
