"""raggedvit.kernels.patch_embed (the kernel of com.raggedvit::PatchEmbed): the torch path against timm's own
Conv2d embedding, input checks, the launch config rule; the Triton kernel in the interpreter (CPU) and, with a GPU,
through the JIT (every launch config, float32 / float16 images)."""

from __future__ import annotations

import pytest
import torch
from _embed_cases import CASES
from _interpreted import run_cases_interpreted

from raggedvit.kernels._embed_kernel import EMBED_LARGE_M, EMBED_MID_M, EmbedConfig, aot_embed_configs, embed_config
from raggedvit.kernels.patch_embed import _launch_patch_embed, patch_embed, patch_embed_reference


def _inputs(gen, B=2, C=3, S=32, p=8, P=1, N=48, device="cpu", dtype=torch.float32):
    K, L = C * p * p, (S // p) ** 2
    img = torch.randn(B, C, S, S, generator=gen).to(dtype)
    w = (torch.randn(K, N, generator=gen) / K**0.5).half()
    pre, pos = torch.randn(P, N, generator=gen), torch.randn(P + L, N, generator=gen)
    return [t.to(device) for t in (img, w, pre, pos)]


def test_cpu_path_is_the_conv_embedding(gen):
    """The reference equals Conv2d(stride p) -> flatten -> cat(prefix) -> + pos, on float16-rounded pixels."""
    img, w, pre, pos = _inputs(gen)
    N, p = w.shape[1], 8
    conv = torch.nn.Conv2d(3, N, p, stride=p, bias=False)
    conv.weight.data = w.float().T.reshape(N, 3, p, p)
    tokens = conv(img.half().float()).flatten(2).transpose(1, 2)
    want = (torch.cat([pre.expand(2, 1, N), tokens], dim=1) + pos).half()
    got = patch_embed(img, w, pre, pos, p)
    assert got.dtype == torch.float16 and got.shape == (2, 17, N)
    torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)
    ref = patch_embed_reference(img, w, pre, pos, p, compute_dtype=torch.float64)
    assert ref.dtype == torch.float64 and torch.allclose(got.double(), ref, rtol=1e-3, atol=2e-3)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"images": torch.zeros(2, 3, 32)}, "images must be 4-D"),
        ({"images": torch.zeros(2, 3, 32, 32, dtype=torch.float64)}, "float32 / float16"),
        ({"weight": torch.zeros(10, 48, dtype=torch.float16)}, r"weight must be \[K = 192, N\] float16"),
        ({"weight": torch.zeros(192, 48)}, "float16"),
        ({"prefix": torch.zeros(1, 40)}, r"prefix must be \[P, 48\] float32"),
        ({"pos": torch.zeros(16, 48)}, r"pos must be \[P \+ L = 17, 48\] float32"),
        ({"patch": 0}, "patch must be >= 1"),
    ],
)
def test_input_checks(gen, kw, message):
    img, w, pre, pos = _inputs(gen)
    args = {"images": img, "weight": w, "prefix": pre, "pos": pos, "patch": 8} | kw
    with pytest.raises(ValueError, match=message):
        patch_embed(**args)


def test_config_rule():
    assert embed_config(196) == embed_config(EMBED_MID_M - 1)
    assert embed_config(EMBED_MID_M) != embed_config(196) and embed_config(EMBED_LARGE_M) != embed_config(EMBED_MID_M)
    assert {embed_config(m) for m in (1, EMBED_MID_M, EMBED_LARGE_M, 10**6)} == {c for _, c in aot_embed_configs()}
    assert [c.block_m for _, c in aot_embed_configs()] == sorted(c.block_m for _, c in aot_embed_configs())


@pytest.fixture(scope="module")
def interpreted_embed() -> dict:
    """_embed_cases.py under TRITON_INTERPRET=1."""
    return run_cases_interpreted("_embed_cases.py")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_triton_kernel_in_interpreter(interpreted_embed, case):
    got = interpreted_embed[case[0]]
    name, _, B, C, H, W, p, P, N, _ = case
    assert got["shape"] == [B, P + (H // p) * (W // p), N]
    assert got["error"] <= 1.0, f"{name}: {got['error']} x the rounding bound"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize(("B", "N", "P"), [(1, 768, 1), (3, 384, 2), (40, 192, 0), (90, 768, 1)])
@pytest.mark.parametrize("config", [None, *[c for _, c in aot_embed_configs()]], ids=str)
def test_triton_jit_matches_reference(gen, dtype, B, N, P, config: EmbedConfig | None):
    img, w, pre, pos = _inputs(gen, B, 3, 224, 16, P, N, device="cuda", dtype=dtype)
    got = _launch_patch_embed(img, w, pre, pos, 16, config=config)
    torch.cuda.synchronize()
    ref = patch_embed_reference(img, w, pre, pos, 16, compute_dtype=torch.float64)
    bound = (0.5 * torch.finfo(torch.float16).eps + 768 * 2.0**-24) * (ref.abs() + 1.0)
    assert float(((got.double() - ref).abs() / bound).max()) <= 1.0
