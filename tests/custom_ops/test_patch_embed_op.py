"""com.raggedvit::PatchEmbed: CPU EP vs the float64 reference (raggedvit.kernels.patch_embed), error statuses, and
the CUDA EP (GPU only)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto

from raggedvit.kernels.patch_embed import patch_embed_reference
from raggedvit.runtime import create_session
from tests.support.ort_models import embed_model

ELEM = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16}
# InvalidGraph: ORT's own type check of the op's schema, at session creation
_STATE = ort.capi.onnxruntime_pybind11_state
ERRORS = (_STATE.Fail, _STATE.InvalidArgument, _STATE.RuntimeException, _STATE.InvalidGraph)


def feeds_for(dtype, B=2, C=3, H=32, W=40, patch=8, P=1, N=48, seed=3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    K, L = C * patch * patch, (H // patch) * (W // patch)
    return {
        "Images": (2 * rng.standard_normal((B, C, H, W))).astype(dtype),
        "Weight": (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float16),
        "Prefix": rng.standard_normal((P, N)).astype(np.float32),
        "Pos": rng.standard_normal((P + L, N)).astype(np.float32),
    }


def reference(f: dict[str, np.ndarray], patch: int) -> np.ndarray:
    t = {k: torch.from_numpy(v) for k, v in f.items()}
    return patch_embed_reference(t["Images"], t["Weight"], t["Prefix"], t["Pos"], patch, torch.float64).numpy()


def run(model: bytes, feeds: dict[str, np.ndarray], device: str = "cpu") -> list[np.ndarray]:
    return create_session(model, device, intra_op_threads=2).run(None, feeds)


def assert_within_rounding(got: np.ndarray, want: np.ndarray, K: int) -> None:
    """|got - want| <= (half a float16 ulp + K * 2^-24 of float32 sums) * (|want| + 1)."""
    bound = (0.5 * float(np.finfo(np.float16).eps) + K * 2.0**-24) * (np.abs(want) + 1.0)
    assert bool((np.abs(got.astype(np.float64) - want) <= bound).all()), float(np.abs(got - want).max())


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize(
    ("B", "C", "H", "W", "patch", "P", "N"),
    [(2, 3, 32, 40, 8, 1, 48), (1, 3, 30, 35, 7, 2, 32), (3, 1, 16, 16, 4, 0, 16), (1, 3, 5, 9, 8, 1, 16),
     (0, 3, 16, 16, 8, 1, 16)],
    ids=["cls", "crop_dist", "no_prefix", "no_patches", "empty"],
)  # fmt: skip
def test_cpu_matches_reference(ort_library, dtype, B, C, H, W, patch, P, N):
    f = feeds_for(dtype, B, C, H, W, patch, P, N)
    (out,) = run(embed_model(ELEM[dtype], patch=patch), f)
    L = (H // patch) * (W // patch)
    assert out.dtype == np.float16 and out.shape == (B, P + L, N)
    assert_within_rounding(out, reference(f, patch), C * patch * patch)


@pytest.mark.parametrize(
    ("model", "feeds", "message"),
    [
        (embed_model(patch=8, shaped=False), {"Images": np.zeros((2, 3, 4), np.float32)}, "input 'Images' must be 4-D"),
        (embed_model(patch=8, shaped=False), {"Weight": np.zeros((10, 48), np.float16)},
         r"input 'Weight' must have shape \[192, 48\] \(Images shape \[2, 3, 32, 40\], patch 8\), got \[10, 48\]"),
        (embed_model(patch=8, shaped=False), {"Prefix": np.zeros((1, 47), np.float32)},
         r"input 'Prefix' must have shape \[1, 48\]"),
        (embed_model(patch=8, shaped=False), {"Pos": np.zeros((20, 48), np.float32)},
         r"input 'Pos' must have shape \[21, 48\]"),
        (embed_model(patch=8, shaped=False, elems={"Pos": TensorProto.FLOAT16}),
         {"Pos": np.zeros((21, 48), np.float16)}, "float"),  # ORT's type check of the schema or the op's, per version
        (embed_model(TensorProto.DOUBLE, patch=8, shaped=False), {"Images": np.zeros((2, 3, 32, 40))},
         "double"),
        (embed_model(patch=None), {}, "attribute 'patch' .* is required"),
        (embed_model(patch=0), {}, r"attribute 'patch' must be in \[1, 32768\]"),
    ],
    ids=["images_rank", "weight_shape", "prefix_shape", "pos_shape", "pos_type", "double", "no_patch", "patch_0"],
)  # fmt: skip
def test_cpu_errors_are_statuses(ort_library, model, feeds, message):
    f = feeds_for(np.float32, patch=8) | feeds
    with pytest.raises(ERRORS, match=message):
        run(model, f)


@pytest.mark.gpu
@pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(), reason="needs onnxruntime-gpu")
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize(("B", "N", "P"), [(1, 768, 1), (4, 384, 2), (32, 768, 1), (128, 384, 1), (3, 192, 0)])
def test_cuda_matches_reference(ort_library, dtype, B, N, P):
    f = feeds_for(dtype, B, 3, 224, 224, 16, P, N, seed=5)
    sess = create_session(embed_model(ELEM[dtype], patch=16), "cuda")
    assert any(p.startswith("CUDA") for p in sess.get_providers())
    (out,) = sess.run(None, f)
    assert_within_rounding(out, reference(f, 16), 768)


@pytest.mark.gpu
@pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(), reason="needs onnxruntime-gpu")
def test_cuda_unsupported_width_is_a_status(ort_library):
    f = feeds_for(np.float32, N=40)
    with pytest.raises(Exception, match="must be a multiple of 16"):
        run(embed_model(patch=8), f, "cuda")
