"""com.raggedvit::RaggedViTBlock on ORT's CUDA EP (the block engine's AOT cubin) against vit_block_reference with
its fp16 roundings, the CPU EP kernel beside it, repeated runs (the counters reset themselves), a whole export
with --engine block as a CUDA graph, and the refusals of what the cubins do not cover. GPU only.

Every session sets session.disable_cpu_ep_fallback=1, so a pass proves the CUDA kernel ran.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from _block_cases import NAMES, OPTIONAL, block_model, random_feeds, reference

from raggedvit.runtime import create_session

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(), reason="needs onnxruntime-gpu"),
]

TOL = 4e-3  # relative to max |y|: fp16 GEMMs, as the CPU EP's float16 recipes (test_vit_block_op.py) x 2


def _elems(feeds):
    return {n: {np.float32: "float", np.float16: "float16", np.int64: "int64", np.int32: "int32"}[feeds[n].dtype.type]
            for n in feeds}  # fmt: skip


def _cuda(feeds, attrs, *, cls_attn=True):
    sess = create_session(block_model(_elems(feeds), attrs, cls_attn=cls_attn), "cuda", disable_cpu_fallback=True)
    return sess.run(None, feeds)


@pytest.mark.parametrize("stream", ["float", "float16"])
@pytest.mark.parametrize(("C", "heads", "lengths", "dead"), [(128, 2, [5, 0, 90, 1], 3), (768, 12, [197], 0),
                                                             (384, 6, [99, 99, 98, 100], 5)])  # fmt: skip
@pytest.mark.parametrize("layer_scale", [False, True])
def test_cuda_matches_reference(ort_library, stream, C, heads, lengths, dead, layer_scale):
    rng = np.random.default_rng(C + len(lengths))
    present = set(NAMES) - ({"ls1", "ls2"} if not layer_scale else set())
    T = sum(lengths) + dead
    attrs = {"num_heads": heads, "epsilon": 1e-6, "scale": (C // heads) ** -0.5}
    feeds = random_feeds(rng, T, C, 4 * C, lengths, stream, "float16", present)
    y, cls = _cuda(feeds, attrs)
    want_y, want_cls = reference(feeds, heads, 1e-6, attrs["scale"], gold=False)
    scale = float(want_y.abs().max())
    assert y.dtype == feeds["x"].dtype and y.shape == (T, C)
    assert np.abs(y.astype(np.float64) - want_y.numpy()).max() <= TOL * scale
    assert np.abs(cls - want_cls.numpy()).max() <= TOL
    assert not y[sum(lengths) :].any() and not cls[sum(lengths) :].any()
    (y_only,) = _cuda(feeds, attrs, cls_attn=False)
    assert np.abs(y_only.astype(np.float64) - y.astype(np.float64)).max() <= TOL * scale


def test_repeated_runs_are_identical(ort_library):
    """The split-K and barrier counters are zero again after every launch: ten runs of one session agree bit for
    bit (a counter left over would hang a barrier or sum a stale partial tile)."""
    feeds = random_feeds(np.random.default_rng(3), 400, 384, 1536, [197, 150], "float16", "float16", set(NAMES))
    attrs = {"num_heads": 6, "epsilon": 1e-6, "scale": 0.125}
    sess = create_session(block_model(_elems(feeds), attrs), "cuda", disable_cpu_fallback=True)
    first = sess.run(None, feeds)
    for _ in range(9):
        again = sess.run(None, feeds)
        for a, b in zip(first, again, strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ("no_qkv_bias", "'qkv_bias' is absent"),
        ("ls1_only", "'ls1' and 'ls2' must be both present"),
        ("head_dim_80", "head dim 80 exceeds"),
    ],
)
def test_refusals_name_the_input(ort_library, change, fragment):
    C, heads = (160, 2) if change == "head_dim_80" else (128, 2)
    present = set(NAMES) - OPTIONAL | {"qkv_bias", "proj_bias", "fc1_bias", "fc2_bias"}
    if change == "no_qkv_bias":
        present -= {"qkv_bias"}
    if change == "ls1_only":
        present |= {"ls1"}
    feeds = random_feeds(np.random.default_rng(4), 20, C, 4 * C, [20], "float", "float16", present)
    with pytest.raises(Exception, match=fragment):  # noqa: PT011 (onnxruntime's own exception types)
        _cuda(feeds, {"num_heads": heads, "epsilon": 1e-6, "scale": 0.125})


def test_float_weights_run_on_the_cpu_ep(ort_library):
    """The CUDA registration declares float16 Linear weights: an fp32 block is placed on the CPU EP (and a session
    that forbids the CPU fallback cannot be created)."""
    feeds = random_feeds(np.random.default_rng(5), 30, 128, 512, [20], "float", "float", set(NAMES))
    attrs = {"num_heads": 2, "epsilon": 1e-6, "scale": 0.125}
    model = block_model(_elems(feeds), attrs)
    with pytest.raises(Exception):  # noqa: B017, PT011 (onnxruntime's own exception types)
        create_session(model, "cuda", disable_cpu_fallback=True)
    got = create_session(model, "cuda").run(None, feeds)
    want = create_session(model).run(None, feeds)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_engine_export_runs_as_a_cuda_graph(ort_library, tmp_path):
    """deit_tiny (seeded) exported with --engine block, fp16-all, capacity layout: every node on the CUDA EP, one
    CUDA graph per call, logits and token counts as the CPU EP's."""
    import timm

    from raggedvit.exporter import export_onnx
    from raggedvit.pruning import PruneSpec
    from raggedvit.runtime import GraphRunner

    torch.manual_seed(0)
    vit = timm.create_model("deit_tiny_patch16_224", pretrained=False).eval()
    spec = PruneSpec("topk-l2", (4,), keep=0.5)
    path = export_onnx(vit, spec, tmp_path / "engine.onnx", dtype="fp16-all", capacity=True, engine="block")
    images = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    runner = GraphRunner(path, 2)
    logits, counts = (t.cpu() for t in runner(images.cuda()))
    logits, counts = logits.clone(), counts.clone()
    cpu = create_session(path).run(None, {"images": images.numpy()})
    np.testing.assert_array_equal(counts.numpy(), cpu[1])
    scale = float(np.abs(cpu[0]).max())
    assert float(np.abs(logits.numpy() - cpu[0]).max()) <= 2e-2 * scale
