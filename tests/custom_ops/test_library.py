"""The built library: exports, no link-time CUDA/ORT dependency, CPU op without CUDA, build CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from raggedvit.custom_ops import library_info

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "raggedvit" / "custom_ops" / "build.py"

_RUN_CPU_OP = r"""
import ctypes, json
import numpy as np, onnxruntime as ort
import torch
from tests.support.ort_models import attention_model
lib = {lib!r}
so = ort.SessionOptions()
so.register_custom_ops_library(lib)
sess = ort.InferenceSession(attention_model(torch.float32, torch.int64, 2), so, providers=["CPUExecutionProvider"])
out, cls = sess.run(None, {{"qkv": np.random.randn(7, 24).astype(np.float32), "cu_seqlens": np.array([0, 3, 7])}})
from onnx import TensorProto
from tests.support.ort_models import linear_model
lin = ort.InferenceSession(linear_model(TensorProto.FLOAT16), so, providers=["CPUExecutionProvider"])
(y,) = lin.run(None, {{"X": np.ones((5, 16), np.float16), "W": np.ones((32, 16), np.float16)}})
info = ctypes.CDLL(lib).raggedvit_ort_info
info.restype = ctypes.c_char_p
print(json.dumps({{"out": list(out.shape), "cls_sum": float(cls.sum()), "linear": [list(y.shape), float(y.max())],
                  "info": json.loads(info())}}))
"""


def run_cpu_op_in_subprocess(lib: str, env: dict[str, str]) -> dict:
    code = _RUN_CPU_OP.format(lib=lib)
    env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))}  # this raggedvit
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(shutil.which("ldd") is None, reason="needs ldd")
def test_no_link_time_cuda_or_onnxruntime(ort_library):
    deps = subprocess.run(["ldd", ort_library], capture_output=True, text=True, check=True).stdout
    for lib in ("libcuda", "libcudart", "libonnxruntime", "libnvrtc"):
        assert lib not in deps, deps


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm")
def test_exports(ort_library):
    symbols = subprocess.run(["nm", "-D", "--defined-only", ort_library], capture_output=True, text=True).stdout
    exported = {line.split()[-1] for line in symbols.splitlines() if " T " in line}
    assert {"RegisterCustomOps", "raggedvit_ort_info"} <= exported
    assert not any(s.startswith("_ZN9raggedvit") for s in exported), "C++ internals should stay hidden"


def test_library_info(ort_library):
    info = library_info()
    assert info["domain"] == "com.raggedvit" and info["op"] == "RaggedAttention"
    build = info["build"]
    assert build["archs"] == [80, 86, 89, 90]
    assert build["dtypes"] == ["bf16", "fp16", "fp32"] and build["cu_dtypes"] == ["i32", "i64"]
    assert build["head_dim_blocks"] == [32, 64, 128]
    assert 0 in build["min_tokens"]
    n_configs = len(build["min_tokens"])
    # kernels x dtypes x cu x BLOCK_D x archs x (neither bias, HAS_POS, HAS_KEY_BIAS)
    assert build["num_kernel_images"] == 2 * 3 * 2 * 3 * 4 * n_configs * 3
    assert build["num_cubins"] <= build["num_kernel_images"]
    kinds = {"fwd", "cls", "fwd+pos", "cls+pos", "fwd+key_bias", "cls+key_bias"}
    assert kinds <= set(build["configs"]["fp16/d64/T>=0"])
    assert build["relative_position_bias"] is True and build["key_bias"] is True
    assert info["ops"] == [
        "RaggedAttention",
        "RaggedLinear",
        "RaggedSelect",
        "BiasGelu",
        "GatherLayerNorm",
        "PatchEmbed",
        "RaggedMerge",
    ]


def test_library_info_linear(ort_library):
    """RaggedLinear cubins: fp16/bf16 x cu i32/i64 x (3 configs x 4 archs + xlarge and tma for sm_90), less the
    configs skipped for shared memory."""
    linear = library_info()["build"]["linear"]
    assert linear["archs"] == [80, 86, 89, 90]
    assert linear["dtypes"] == ["bf16", "fp16"] and linear["cu_dtypes"] == ["i32", "i64"]
    assert set(linear["configs"]) == {"small_narrow", "small_wide", "large", "xlarge", "tma"}
    assert linear["configs"]["tma"]["tma"] and not linear["configs"]["xlarge"]["tma"]
    assert linear["num_cubins"] + len(linear["skipped"]) == 2 * 2 * (3 * 4 + 2)
    for config in ("xlarge", "tma"):
        assert {k.split("/")[1] for k in linear["shared_bytes"] if k.startswith(f"{config}/")} == {"sm_90"}
    assert len(linear["shared_bytes"]) == linear["num_cubins"] and linear["cubin_bytes"] > 0
    assert linear["rule"] == {"large_t": 1024, "narrow_n": 1024, "capacity_narrow_n": 1536, "tma_min_arch": 90}


def test_library_info_select(ort_library):
    """RaggedSelect cubins: _select_count and _select_scatter for every arch and sort width."""
    from raggedvit.kernels._select_kernel import SELECT_BLOCK, SELECT_SORT_WIDTHS

    select = library_info()["build"]["select"]
    assert select["archs"] == [80, 86, 89, 90]
    assert select["num_cubins"] == 2 * 4 * len(SELECT_SORT_WIDTHS) and select["cubin_bytes"] > 0
    assert select["block"] == [SELECT_BLOCK]
    assert select["sort_widths"] == {str(wp): warps for wp, warps in SELECT_SORT_WIDTHS}


def test_library_info_merge(ort_library):
    """RaggedMerge cubins: fp16/fp32 x every width x every head-dim block x 4 archs, with the kernel file's rule."""
    from raggedvit.kernels import _merge_kernel as mk

    merge = library_info()["build"]["merge"]
    assert merge["archs"] == [80, 86, 89, 90] and merge["dtypes"] == ["fp16", "fp32"]
    n = 2 * len(mk.MERGE_WIDTHS) * len(mk.MERGE_HEAD_DIMS) * 4
    assert merge["num_cubins"] == n == len(merge["shared_bytes"]) and merge["cubin_bytes"] > 0
    assert merge["rule"]["widths"] == {str(w): warps for w, warps in mk.MERGE_WIDTHS}
    assert merge["rule"]["head_dims"] == list(mk.MERGE_HEAD_DIMS)
    assert max(merge["shared_bytes"].values()) <= 48 * 1024  # no opt-in: every arch's default limit


def test_library_info_gelu(ort_library):
    """BiasGelu cubins: fp16/bf16 x both configs x 4 archs, with gelu_config's rule."""
    from raggedvit.kernels._linear_config import GELU_LARGE_M, aot_gelu_configs

    gelu = library_info()["build"]["gelu"]
    assert gelu["archs"] == [80, 86, 89, 90] and gelu["dtypes"] == ["bf16", "fp16"]
    assert gelu["num_cubins"] == 2 * 2 * 4 and gelu["cubin_bytes"] > 0
    assert gelu["rule"] == {"large_m": GELU_LARGE_M}
    assert gelu["configs"] == {
        name: {"block_m": c.block_m, "block_n": c.block_n, "num_warps": c.num_warps} for name, c in aot_gelu_configs()
    }


def test_library_info_norm(ort_library):
    """GatherLayerNorm cubins: fp16/bf16 x cu int32/int64 x every BLOCK_D x 4 archs, with norm_config's configs."""
    from raggedvit.kernels._norm_kernel import NORM_BLOCK_DS, aot_norm_configs

    norm = library_info()["build"]["norm"]
    assert norm["archs"] == [80, 86, 89, 90] and norm["dtypes"] == ["bf16", "fp16"]
    assert norm["cu_dtypes"] == ["i32", "i64"]
    assert norm["num_cubins"] == 2 * 2 * len(NORM_BLOCK_DS) * 4 and norm["cubin_bytes"] > 0
    assert norm["rule"] == {"block_ds": list(NORM_BLOCK_DS)}
    assert norm["configs"] == {str(c.block_d): {"block_r": c.block_r, "num_warps": c.num_warps}
                               for c in aot_norm_configs()}  # fmt: skip


def test_library_info_embed(ort_library):
    """PatchEmbed cubins: fp32/fp16 images x every config x aligned or not x 4 archs, with embed_config's configs
    and rule."""
    from raggedvit.kernels._embed_kernel import EMBED_LARGE_M, EMBED_MID_M, aot_embed_configs

    embed = library_info()["build"]["embed"]
    assert embed["archs"] == [80, 86, 89, 90] and embed["dtypes"] == ["fp16", "fp32"]
    assert embed["num_cubins"] == 2 * len(aot_embed_configs()) * 2 * 4 and embed["cubin_bytes"] > 0
    assert embed["aligned"] == [False, True]
    assert embed["rule"] == {"mid_m": EMBED_MID_M, "large_m": EMBED_LARGE_M}
    keys = ("block_m", "block_n", "block_k", "num_warps", "num_stages")
    assert embed["configs"] == {name: {k: getattr(c, k) for k in keys} for name, c in aot_embed_configs()}


def test_cpu_op_runs_with_cuda_hidden(ort_library):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    res = run_cpu_op_in_subprocess(ort_library, env)
    assert res["out"] == [7, 8]
    assert abs(res["cls_sum"] - 2.0) < 1e-5  # two sequences, cls_attn sums to 1 in each
    assert res["linear"] == [[5, 32], 16.0]  # RaggedLinear on the CPU EP
    assert res["info"]["cuda_op_registered"] is False


def test_build_cli_single_arch(ort_library, tmp_path):
    """--archs 90 into a temp dir (cubins come from the build cache), then load and run it."""
    out = tmp_path / "libraggedvit_ort.so"
    proc = subprocess.run(
        [sys.executable, str(BUILD), "--output", str(out), "--archs", "90", "--jobs", "2"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "kernel table rows, 20 linear kernel rows" in proc.stdout and "for sm_90" in proc.stdout  # 3 + xlarge + tma
    res = run_cpu_op_in_subprocess(str(out), dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert res["info"]["build"]["archs"] == [90] and res["out"] == [7, 8]
    assert res["info"]["build"]["linear"]["archs"] == [90] and res["linear"] == [[5, 32], 16.0]


@pytest.mark.parametrize(("archs", "message"), [("sm90", "comma-separated SM numbers"), ("75", "sm_80 or newer")])
def test_build_cli_rejects_bad_archs(tmp_path, archs, message):
    proc = subprocess.run(
        [sys.executable, str(BUILD), "--output", str(tmp_path / "x.so"), "--archs", archs],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "x.so").exists()
