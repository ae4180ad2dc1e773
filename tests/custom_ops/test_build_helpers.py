"""Pieces of the op-library build: ORT header discovery, the AOT plan, the generated C++ source."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from raggedvit.custom_ops import _aot, _codegen, _ort_headers

ROOT = Path(__file__).resolve().parents[2]
DEB = next(iter(sorted((ROOT.parent / "shared" / "device").glob("libonnxruntime-dev_*.deb"))), Path("/missing.deb"))


@pytest.fixture
def no_system_headers(monkeypatch):
    real = _ort_headers._usable

    def usable(include_dir: Path, tried: list[str]) -> bool:
        if str(include_dir) == "/usr/include/onnxruntime":
            tried.append("/usr/include/onnxruntime: hidden by the test")
            return False
        return real(include_dir, tried)

    monkeypatch.setattr(_ort_headers, "_usable", usable)
    monkeypatch.delenv("ORT_INCLUDE_DIR", raising=False)


def test_env_var_wins(tmp_path, monkeypatch):
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "onnxruntime_cxx_api.h").write_text("")
    (inc / "onnxruntime_c_api.h").write_text("#define ORT_API_VERSION 22\n")
    monkeypatch.setenv("ORT_INCLUDE_DIR", str(inc))
    assert _ort_headers.find_ort_headers(tmp_path, tmp_path / "build") == inc
    assert _ort_headers.header_api_version(inc) == 22


@pytest.mark.skipif(not DEB.exists() or shutil.which("dpkg-deb") is None, reason="needs the .deb and dpkg-deb")
def test_headers_from_the_shared_deb(tmp_path, no_system_headers):
    repo = tmp_path / "repo"
    (tmp_path / "shared" / "device").mkdir(parents=True)
    (tmp_path / "shared" / "device" / DEB.name).symlink_to(DEB)
    inc = _ort_headers.find_ort_headers(repo, repo / "build")
    assert inc == repo / "build" / "ort-headers" / "usr" / "include" / "onnxruntime"
    assert (_ort_headers.header_api_version(inc) or 0) >= 21
    # second call: the cache under build/ is used
    assert _ort_headers.find_ort_headers(repo, repo / "build") == inc


def test_clear_error_when_nothing_works(tmp_path, monkeypatch, no_system_headers):
    monkeypatch.setenv("ORT_INCLUDE_DIR", str(tmp_path / "nowhere"))
    monkeypatch.setattr(_ort_headers.shutil, "which", lambda name: None)  # no apt-get, no dpkg-deb
    with pytest.raises(_ort_headers.OrtHeadersNotFound, match="set ORT_INCLUDE_DIR") as info:
        _ort_headers.find_ort_headers(tmp_path / "repo", tmp_path / "build")
    assert "nowhere: no onnxruntime_c_api.h" in str(info.value) and "apt-get: not found" in str(info.value)


def test_plan_covers_every_kernel_dtype_cu_block_arch():
    jobs, rows = _aot.make_plan((80, 90))
    configs = _aot.kernel_configs()
    assert len(rows) == 2 * 2 * len(configs) * 2 * 2  # kernels x cu dtypes x configs x archs x HAS_POS
    assert {(j.kernel, j.dtype, j.cu_dtype, j.block_d, j.arch, j.has_pos) for j in jobs} == {
        (k, d, c, b, a, p)
        for k in ("fwd", "cls")
        for d in _aot.DTYPES
        for c in _aot.CU_DTYPES
        for b in _aot.BLOCK_DS
        for a in (80, 90)
        for p in (False, True)
    }
    assert len(jobs) == len(set(jobs)) <= len(rows)
    assert 0 in {m for _, m in rows}


def test_signature_hints_pointers_and_D():
    job = _aot.AotJob("fwd", "bf16", "i64", 64, 90, 64, 64, 4, 2)
    sig, consts = job.signature()
    assert sig["QKV"] == "*bf16" and sig["CU"] == "*i64" and sig["Lse"] == "*fp32" and sig["T"] == "i32"
    assert consts == {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_D": 64, "HAS_POS": False}
    assert sig["PosTable"] == "*fp32" and sig["TokPos"] == "*i64" and sig["grid_h"] == sig["num_prefix"] == "i32"
    assert _aot.AotJob("fwd", "bf16", "i64", 64, 90, 64, 64, 4, 2, True).signature()[1]["HAS_POS"] is True
    cls_sig, cls_consts = _aot.AotJob("cls", "fp16", "i32", 32, 80, 0, 128, 4, 1).signature()
    assert sig["Bias"] == "*bf16" and sig["has_bias"] == "i32" and list(sig)[:3] == ["QKV", "Bias", "CU"]
    assert list(cls_sig)[:5] == ["QKV", "Bias", "CU", "Lse", "ClsAttn"] and "BLOCK_M" not in cls_consts


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
    assert "IndexType::kInt32, 64, false, 90, 2048," in text
