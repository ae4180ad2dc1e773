"""raggedvit.runtime: session options, providers, io binding (CPU here; CUDA in the gpu-marked test)."""

from __future__ import annotations

import sys
from pathlib import Path

import onnxruntime as ort
import pytest
import torch

from raggedvit.kernels.reference import ragged_attention_reference
from raggedvit.runtime import bind_tensor, create_session, providers_for, run_with_iobinding, session_options
from tests.support.ort_models import attention_model
from tests.support.testing import assert_close

sys.path.insert(0, str(Path(__file__).parent / "custom_ops"))
from _ort_library import ensure_library  # noqa: E402


@pytest.fixture(scope="module")
def ort_library() -> str:
    return ensure_library()


def test_session_options_register_library_and_fallback_flag(ort_library):
    so = session_options(disable_cpu_fallback=True, intra_op_threads=1)
    assert so.get_session_config_entry("session.disable_cpu_ep_fallback") == "1"
    assert so.intra_op_num_threads == 1
    so = session_options()
    sess = ort.InferenceSession(attention_model(torch.float32, torch.int32, 2), so, providers=["CPUExecutionProvider"])
    assert [o.name for o in sess.get_outputs()] == ["out", "cls_attn"]


def test_providers():
    assert providers_for("cpu") == ["CPUExecutionProvider"]
    assert providers_for("cpu", cpu_fallback=False) == ["CPUExecutionProvider"]
    with pytest.raises(ValueError, match="device must be"):
        providers_for("tpu")  # type: ignore[arg-type]
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        with pytest.raises(RuntimeError, match="no CUDAExecutionProvider"):
            providers_for("cuda")
    with pytest.raises(ValueError, match="cuda_options need device='cuda'"):
        providers_for("cpu", cuda_options={"tunable_op_enable": "1"})


def test_providers_cuda_options_after_defaults(monkeypatch):
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    (cuda, cpu) = providers_for("cuda", cuda_graph=True, cuda_options={"tunable_op_enable": "1", "use_tf32": "1"})
    assert cpu == "CPUExecutionProvider"
    assert cuda == ("CUDAExecutionProvider", {"device_id": "0", "use_tf32": "1", "enable_cuda_graph": "1",
                                              "tunable_op_enable": "1"})  # fmt: skip
    assert providers_for("cuda", cpu_fallback=False)[0][1] == {"device_id": "0", "use_tf32": "0"}


def test_create_session_from_path_and_iobinding(ort_library, tmp_path):
    path = tmp_path / "attn.onnx"
    path.write_bytes(attention_model(torch.float16, torch.int64, 2))
    sess = create_session(path, "cpu")
    qkv = torch.randn(9, 3 * 2 * 16).half()
    cu = torch.tensor([0, 4, 9])
    out = torch.empty(9, 32, dtype=torch.float16)
    values = run_with_iobinding(sess, {"qkv": qkv, "cu_seqlens": cu}, {"out": out})
    assert len(values) == 1
    assert_close(out, ragged_attention_reference(qkv, cu, 2, compute_dtype=torch.float64).half(), name="out")
    # outputs allocated by ORT, inputs given as OrtValues
    qkv_value = ort.OrtValue.ortvalue_from_numpy(qkv.numpy())
    out2, cls = run_with_iobinding(sess, {"qkv": qkv_value, "cu_seqlens": cu}, output_device="cpu")
    assert torch.equal(torch.from_numpy(out2.numpy()), out)
    assert cls.shape() == [9]


def test_bind_tensor_rejects_non_contiguous(ort_library):
    sess = create_session(attention_model(torch.float32, torch.int64, 2), "cpu")
    with pytest.raises(ValueError, match="contiguous"):
        bind_tensor(sess.io_binding(), "qkv", torch.randn(24, 9).t())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_iobinding_no_cpu_fallback(ort_library):
    sess = create_session(attention_model(torch.float16, torch.int32, 2), "cuda", disable_cpu_fallback=True)
    qkv = torch.randn(50, 192, device="cuda").half()  # H = 2, D = 32 (the CUDA kernels ship D % 16 == 0, 32..128)
    cu = torch.tensor([0, 20, 50], device="cuda", dtype=torch.int32)
    out = torch.empty(50, 64, device="cuda", dtype=torch.float16)
    cls = torch.empty(50, device="cuda")
    run_with_iobinding(sess, {"qkv": qkv, "cu_seqlens": cu}, {"out": out, "cls_attn": cls})
    ref_out, ref_cls = ragged_attention_reference(
        qkv.cpu(), cu.cpu(), 2, return_cls_attn=True, compute_dtype=torch.float64
    )
    assert_close(out, ref_out.half(), name="out")
    assert_close(cls, ref_cls.float(), rtol=1e-3, name="cls_attn")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", ["fp16", "fp16-all"])
def test_graph_runner_matches_per_node_run(ort_library, tmp_path, dtype):
    """A topk-l2 export replayed as a CUDA graph gives the per-node run's outputs and follows new input data."""
    from raggedvit.exporter import export_onnx
    from raggedvit.pruning import PruneSpec
    from raggedvit.runtime import GraphRunner
    from raggedvit.weights import load_vit

    vit, _ = load_vit("deit_tiny_patch16_224", seed=0, model_kwargs={"depth": 4})
    path = export_onnx(vit, PruneSpec("topk-l2", (2,), keep=0.5), tmp_path / "m.onnx", dtype=dtype)
    x = torch.randn(3, 3, 224, 224, generator=torch.Generator().manual_seed(0)).cuda()
    plain = create_session(path, "cuda")
    want = [torch.from_numpy(v.numpy()) for v in run_with_iobinding(plain, {"images": x}, output_device="cpu")]
    run = GraphRunner(path, batch=3)
    logits, counts = run(x)
    assert torch.equal(counts.cpu(), want[1]) and counts.cpu().tolist() == [[99]] * 3
    assert_close(logits.cpu(), want[0], rtol=1e-3, name="logits")
    logits2, _ = run(x.flip(0))
    assert_close(logits2.cpu(), want[0].flip(0), rtol=1e-2, name="logits after new input")
    with pytest.raises(ValueError, match="expected shape"):
        run(x[:2])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_graph_runner_capacity_cls_mass(ort_library, tmp_path, dtype):
    """A capacity-layout cls-mass export (data-dependent counts, static shapes) replayed as a CUDA graph gives the
    node-by-node run's outputs, for new input data too; its token_counts come back on the device."""
    from raggedvit.exporter import export_onnx
    from raggedvit.images import preprocess, sample_images
    from raggedvit.pruning import PruneSpec
    from raggedvit.runtime import GraphRunner
    from raggedvit.weights import load_vit

    vit, _ = load_vit("deit_tiny_patch16_224", seed=0, model_kwargs={"depth": 4})
    spec = PruneSpec("cls-mass", (1, 3), mass=0.7)
    path = export_onnx(vit, spec, tmp_path / "m.onnx", dtype=dtype, capacity=True)
    x = preprocess(sample_images()[:3], vit).cuda()
    plain = create_session(path, "cuda", batch=3)
    run = GraphRunner(path, batch=3)
    for images in (x, x.flip(0).contiguous()):
        want = [torch.from_numpy(v.numpy()) for v in run_with_iobinding(plain, {"images": images}, output_device="cpu")]
        logits, counts = run(images)
        assert counts.is_cuda and torch.equal(counts.cpu(), want[1])
        assert_close(logits.cpu(), want[0], rtol=1e-3, name="logits")
    assert len({tuple(c) for c in want[1].tolist()}) > 1  # the counts follow the data


def test_graph_runner_refuses_data_dependent_counts(ort_library, tmp_path):
    from raggedvit.exporter import export_onnx
    from raggedvit.pruning import PruneSpec
    from raggedvit.runtime import GraphRunner
    from raggedvit.weights import load_vit

    vit, _ = load_vit("deit_tiny_patch16_224", seed=0, model_kwargs={"depth": 2})
    path = export_onnx(vit, PruneSpec("cls-mass", (1,)), tmp_path / "m.onnx")
    with pytest.raises(ValueError, match="cannot be captured"):
        GraphRunner(path, batch=2)
