"""Pieces of the op-library build: ORT header discovery, the AOT plan, the generated C++ source."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from raggedvit.custom_ops import _aot, _aot_linear, _codegen, _ort_headers

ROOT = Path(__file__).resolve().parents[2]
# a libonnxruntime-dev .deb to unpack: $ORT_DEV_DEB (CI sets it)
_DEBS = [os.environ.get("ORT_DEV_DEB", "")]
DEB = next((Path(d) for d in _DEBS if d and Path(d).is_file()), Path("/missing.deb"))


@pytest.fixture
def no_system_headers(monkeypatch):
    """Only what the test sets up is found: no env vars, pkg-config or install prefixes of this machine."""
    monkeypatch.setattr(_ort_headers, "_pkg_config_dirs", lambda tried: [])
    monkeypatch.setattr(_ort_headers, "_prefix_dirs", lambda: [])
    for var in ("ORT_INCLUDE_DIR", "ORT_DEV_DEB", "CONDA_PREFIX"):
        monkeypatch.delenv(var, raising=False)


def _headers(inc: Path, version: int = 22) -> Path:
    inc.mkdir(parents=True)
    (inc / "onnxruntime_cxx_api.h").write_text("")
    (inc / "onnxruntime_c_api.h").write_text(f"#define ORT_API_VERSION {version}\n")
    return inc


def test_env_var_wins(tmp_path, monkeypatch):
    inc = _headers(tmp_path / "inc")
    monkeypatch.setenv("ORT_INCLUDE_DIR", str(inc))
    assert _ort_headers.find_ort_headers(tmp_path / "build") == inc
    assert _ort_headers.header_api_version(inc) == 22


@pytest.mark.skipif(shutil.which("pkg-config") is None, reason="needs pkg-config")
def test_headers_from_pkg_config(tmp_path, monkeypatch, no_system_headers):
    """A libonnxruntime.pc on PKG_CONFIG_PATH (as Debian's libonnxruntime-dev installs one) names the folder."""
    monkeypatch.undo()  # the real pkg-config lookup, but still no env vars and no install prefixes
    monkeypatch.setattr(_ort_headers, "_prefix_dirs", lambda: [])
    for var in ("ORT_INCLUDE_DIR", "ORT_DEV_DEB"):
        monkeypatch.delenv(var, raising=False)
    old = _headers(tmp_path / "old", version=20)  # too old: skipped, and said so
    inc = _headers(tmp_path / "inc")
    pc = tmp_path / "pc"
    pc.mkdir()
    (pc / "libonnxruntime.pc").write_text(
        f"Name: onnxruntime\nDescription: test\nVersion: 1.22.0\nCflags: -I{old} -I{inc}\nLibs: -lonnxruntime\n"
    )
    monkeypatch.setenv("PKG_CONFIG_PATH", str(pc))
    assert _ort_headers.find_ort_headers(tmp_path / "build") == inc


@pytest.mark.skipif(not DEB.exists() or shutil.which("dpkg-deb") is None, reason="needs the .deb and dpkg-deb")
def test_headers_from_a_deb(tmp_path, monkeypatch, no_system_headers):
    monkeypatch.setenv("ORT_DEV_DEB", str(DEB))
    build = tmp_path / "build"
    inc = _ort_headers.find_ort_headers(build)
    assert inc == build / "ort-headers" / "usr" / "include" / "onnxruntime"
    assert (_ort_headers.header_api_version(inc) or 0) >= 21
    # without the variable the headers unpacked by the earlier build are used
    monkeypatch.delenv("ORT_DEV_DEB")
    assert _ort_headers.find_ort_headers(build) == inc


def test_clear_error_when_nothing_works(tmp_path, monkeypatch, no_system_headers):
    monkeypatch.setenv("ORT_INCLUDE_DIR", str(tmp_path / "nowhere"))
    monkeypatch.setenv("ORT_DEV_DEB", str(tmp_path / "none.deb"))
    monkeypatch.setattr(_ort_headers.shutil, "which", lambda name: None)  # no apt-get, no dpkg-deb
    with pytest.raises(_ort_headers.OrtHeadersNotFound, match="set ORT_INCLUDE_DIR") as info:
        _ort_headers.find_ort_headers(tmp_path / "build")
    text = str(info.value)
    assert "nowhere: no onnxruntime_c_api.h" in text and "apt-get: not found" in text
    assert f"ORT_DEV_DEB={tmp_path / 'none.deb'}: no such file" in text and "set ORT_DEV_DEB" in text


def test_plan_covers_every_kernel_dtype_cu_block_arch():
    jobs, rows = _aot.make_plan((80, 90))
    configs = _aot.kernel_configs()
    assert len(rows) == 2 * 2 * len(configs) * 2 * 3  # kernels x cu dtypes x configs x archs x bias variants
    assert {(j.kernel, j.dtype, j.cu_dtype, j.block_d, j.arch, j.has_pos, j.has_key_bias) for j in jobs} == {
        (k, d, c, b, a, p, kb)
        for k in ("fwd", "cls")
        for d in _aot.DTYPES
        for c in _aot.CU_DTYPES
        for b in _aot.BLOCK_DS
        for a in (80, 90)
        for p, kb in ((False, False), (True, False), (False, True))
    }
    assert len(jobs) == len(set(jobs)) <= len(rows)
    assert 0 in {m for _, m in rows}


def test_signature_hints_pointers_and_D():
    job = _aot.AotJob("fwd", "bf16", "i64", 64, 90, 64, 64, 4, 2)
    sig, consts = job.signature()
    assert sig["QKV"] == "*bf16" and sig["CU"] == "*i64" and sig["Lse"] == "*fp32" and sig["T"] == "i32"
    assert consts == {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_D": 64, "HAS_POS": False, "HAS_KEY_BIAS": False}
    assert list(sig)[5:8] == ["PosTable", "TokPos", "KeyBias"] and sig["KeyBias"] == "*fp32"
    kb_job = _aot.AotJob("fwd", "bf16", "i64", 64, 90, 64, 64, 4, 2, has_key_bias=True)
    assert kb_job.signature()[1]["HAS_KEY_BIAS"] is True
    assert sig["PosTable"] == "*fp32" and sig["TokPos"] == "*i64" and sig["grid_h"] == sig["num_prefix"] == "i32"
    assert _aot.AotJob("fwd", "bf16", "i64", 64, 90, 64, 64, 4, 2, True).signature()[1]["HAS_POS"] is True
    cls_sig, cls_consts = _aot.AotJob("cls", "fp16", "i32", 32, 80, 0, 128, 4, 1, cls_heads=8).signature()
    assert sig["Bias"] == "*bf16" and sig["has_bias"] == "i32" and list(sig)[:3] == ["QKV", "Bias", "CU"]
    assert list(cls_sig)[:5] == ["QKV", "Bias", "CU", "Lse", "ClsAttn"] and "BLOCK_M" not in cls_consts
    assert cls_consts["HG"] == 8 and "HG" not in consts
    with pytest.raises(ValueError, match="cls_heads"):
        _aot.AotJob("cls", "fp16", "i32", 32, 80, 0, 128, 4, 1).signature()


def test_generated_source_shares_cubins_between_rows(tmp_path):
    job = _aot.AotJob("cls", "fp16", "i32", 64, 90, 0, 128, 4, 1)
    res = _aot.AotResult(job, b'\x00\x7f"\\x', "_ragged_cls_attn", 1024, 4, 11)
    rows = [(res, 0), (res, 2048)]
    info = _codegen.build_info(rows, "0.1", "3.8")
    assert info["num_cubins"] == 1 and info["num_kernel_images"] == 2 and info["min_tokens"] == [0, 2048]
    path = tmp_path / "cubins.cc"
    _codegen.write_cubin_source(path, rows, info)
    text = path.read_text()
    assert text.count("const unsigned char kCubin") == 1
    assert '"\\x00\\x7f\\x22\\x5c\\x78"' in text  # every byte escaped (quotes, backslashes included)
    assert "IndexType::kInt32, 64, false, false, 90, 2048," in text
    assert "const size_t kNumLinearImages = 0;" in text and "const int64_t kLinearLargeT = 1024;" in text


def test_linear_plan_and_signature():
    jobs = _aot_linear.make_linear_plan((80, 90))
    # dtypes x cu dtypes x (configs x archs + xlarge + tma)
    assert len(jobs) == len(set(jobs)) == 2 * 2 * (3 * 2 + 2)
    assert {(j.dtype, j.cu_dtype, j.config, j.arch) for j in jobs} == {
        (d, c, n, a) for d in ("fp16", "bf16") for c in ("i32", "i64") for n in ("small_narrow", "small_wide", "large")
        for a in (80, 90)
    } | {(d, c, n, 90) for d in ("fp16", "bf16") for c in ("i32", "i64") for n in ("xlarge", "tma")}  # fmt: skip
    xl = next(j for j in jobs if j.config == "xlarge")
    assert (xl.block_m, xl.block_n, xl.block_k, xl.num_warps, xl.num_stages) == (128, 256, 64, 8, 4)
    assert {j.tma for j in jobs if j.config == "tma"} == {True} and not any(j.tma for j in jobs if j.config != "tma")
    tma = next(j for j in jobs if j.config == "tma" and j.dtype == "bf16")
    sig, consts = tma.signature()
    assert tma.function == "_ragged_linear_tma" and list(sig)[:6] == ["X_desc", "W_desc", "Res_desc", "Y_desc", "Bias",
                                                                       "CU"]  # fmt: skip
    # the epilogue stores BLOCK_N / epilogue_split columns at a time: Res / Y descriptors of that width
    width = tma.block_n // tma.epilogue_split
    assert sig["Y_desc"] == sig["Res_desc"] == f"tensordesc<bf16[{tma.block_m}, {width}]>"
    assert consts["EPI_SPLIT"] == tma.epilogue_split and width % 64 == 0
    assert sig["X_desc"] == f"tensordesc<bf16[{tma.block_m}, 64]>"
    assert sig["W_desc"] == f"tensordesc<bf16[{tma.block_n}, 64]>"
    assert sig["num_programs"] == "i32" and tma.block_k * 2 == _aot_linear.TMA_INNER_BYTES
    job = next(j for j in jobs if j.dtype == "bf16" and j.cu_dtype == "i64" and j.config == "large")
    sig, consts = job.signature()
    assert list(sig)[:6] == ["X", "W", "Bias", "Res", "CU", "Y"] and sig["CU"] == "*i64" and sig["Res"] == "*bf16"
    assert all(sig[n] == "i32" for n in ("T", "N", "K", "B", "has_bias", "has_res", "has_live", "activation"))
    assert consts == {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}
    assert job.hinted_ints == ("N", "K") and job.source.name == "_linear_kernel.py"
    assert _aot.cache_key(job) != _aot.cache_key(
        _aot_linear.LinearJob("bf16", "i64", 90, "large", 128, 128, 64, 8, 4, 3)
    )


def test_linear_configs_over_the_shared_memory_limit_are_skipped(tmp_path):
    """A config above its arch's opt-in limit is left out of the table and listed under "skipped"."""
    big = _aot_linear.LinearJob("fp16", "i32", 86, "large", 128, 128, 64, 8, 8, 3)
    small = _aot_linear.LinearJob("fp16", "i32", 86, "small_wide", 64, 64, 64, 8, 4, 4)
    assert not _aot_linear.fits_arch(big, 99 * 1024 + 1) and _aot_linear.fits_arch(big, 99 * 1024)
    assert _aot_linear.fits_arch(_aot_linear.LinearJob("fp16", "i32", 90, "large", 128, 128, 64, 8, 8, 3), 200_000)
    kept = _aot.AotResult(small, b"\x01\x02", "_ragged_linear", 49152, 4, 16)
    dropped = _aot.AotResult(big, b"\x03", "_ragged_linear", 120_000, 8, 16)
    info = _codegen.build_info([], "0.1", "3.8", [kept], [dropped])
    assert info["linear"]["skipped"] == {"large/sm_86/fp16/i32": 120_000} and info["linear"]["num_cubins"] == 1
    path = tmp_path / "cubins.cc"
    _codegen.write_cubin_source(path, [], info, [kept])
    text = path.read_text()
    assert '{DType::kFloat16, IndexType::kInt32, 86, LinearConfig::kSmallWide, "_ragged_linear", kCubin0, 2,' in text
    assert "const size_t kNumLinearImages = 1;" in text and text.count("const unsigned char kCubin") == 1


def test_merge_plan_signature_and_table(tmp_path):
    """RaggedMerge: one job per arch x dtype x width x head-dim block with the kernel file's tiles; C and Dh hinted;
    the generated MergeImage rows and the build info."""
    from raggedvit.custom_ops import _aot_merge
    from raggedvit.kernels import _merge_kernel as mk

    jobs = _aot_merge.make_merge_plan((80, 90))
    assert len(jobs) == len(set(jobs)) == 2 * 2 * len(mk.MERGE_WIDTHS) * len(mk.MERGE_HEAD_DIMS)
    assert {(j.arch, j.dtype, j.width, j.num_warps, j.block_d) for j in jobs} == {
        (a, d, w, nw, bd) for a in (80, 90) for d in ("fp16", "fp32") for w, nw in mk.MERGE_WIDTHS
        for bd in mk.MERGE_HEAD_DIMS
    }  # fmt: skip
    job = next(j for j in jobs if j.dtype == "fp32" and j.arch == 90)
    sig, consts = job.signature()
    assert list(sig)[:12] == ["X", "QKV", "Bias", "Size", "Skip", "SkipBias", "XOut", "SizeOut", "CuOut", "Src",
                              "KeyBias", "Score"]  # fmt: skip
    assert sig["X"] == sig["QKV"] == sig["Bias"] == sig["Skip"] == sig["SkipBias"] == sig["XOut"] == "*fp32"
    assert sig["CuOut"] == sig["Src"] == "*i64"
    assert sig["Size"] == sig["SizeOut"] == sig["KeyBias"] == sig["Score"] == "*fp32"
    ints = ("n", "C", "H", "Dh", "num_prefix", "r", "has_bias", "has_size", "has_skip", "has_skip_bias", "class_token")
    assert all(sig[n] == "i32" for n in ints)
    assert consts == {"NP": job.width, "BLOCK_D": job.block_d, "BLOCK_A": mk.MERGE_BLOCK_A,
                      "BLOCK_B": mk.MERGE_BLOCK_B, "BLOCK_M": mk.MERGE_BLOCK_M, "BLOCK_ROWS": mk.MERGE_BLOCK_ROWS,
                      "BLOCK_C": mk.MERGE_ROW_BYTES // 4}  # fmt: skip
    assert next(j for j in jobs if j.dtype == "fp16").block_c == mk.MERGE_ROW_BYTES // 2
    assert job.hinted_ints == ("C", "Dh") and job.function == "_ragged_merge" and job.source.name == "_merge_kernel.py"
    res = _aot.AotResult(job, b"\x01\x02\x03", "_ragged_merge", 49152, job.num_warps, 21)
    info = _codegen.build_info([], "0.1", "3.8", merge=[res])
    merge = info["merge"]
    assert merge["num_cubins"] == 1 and merge["cubin_bytes"] == 3 and merge["archs"] == [90]
    assert merge["rule"]["widths"] == {str(w): nw for w, nw in mk.MERGE_WIDTHS}
    assert merge["rule"]["head_dims"] == list(mk.MERGE_HEAD_DIMS)
    path = tmp_path / "cubins.cc"
    _codegen.write_cubin_source(path, [], info, merge=[res])
    text = path.read_text()
    row = f'{{DType::kFloat32, 90, {job.width}, {job.block_d}, "_ragged_merge", kCubin0, 3, 49152, {job.num_warps}, '
    assert row in text and "const size_t kNumMergeImages = 1;" in text
    _codegen.write_cubin_source(path, [], _codegen.build_info([], "0.1", "3.8"))
    assert "const size_t kNumMergeImages = 0;" in path.read_text()  # the placeholder row keeps the array non-empty
