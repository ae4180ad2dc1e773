"""custom_ops/_aot_block.py: the block engine's AOT jobs match the kernel's signature, cover the exporter's
layouts, key the cache on every source the kernel imports, and compile for sm_90 on this CPU-only machine with a
resource report (the whole plan is compiled by the library build: test_library.py::test_library_info_block)."""

from __future__ import annotations

import inspect
from dataclasses import replace
from pathlib import Path

import pytest

from raggedvit.custom_ops import _aot, _aot_block
from raggedvit.kernels import _block_kernel
from raggedvit.kernels._block_config import AOT_BLOCK_CS, ENGINE_CONFIGS


def test_plan_covers_the_exported_layouts() -> None:
    jobs = _aot_block.make_block_plan((80, 86, 89, 90))
    assert {j.arch for j in jobs} == {80, 90}  # sm_86 / sm_89 run the sm_80 cubins
    assert len(jobs) == len(set(jobs)) == 2 * 2 * 2 * 2 * len(AOT_BLOCK_CS)
    assert {(j.stream_dtype, j.gemm_dtype, j.cu_dtype) for j in jobs} == {
        ("fp32", "fp16", "i64"),
        ("fp16", "fp16", "i64"),
    }
    assert _aot_block.make_block_plan((86,)) == []


def test_signature_is_the_kernels_in_order() -> None:
    """Every kernel argument appears once, in the kernel's order; constexprs are the JIT launcher's
    (kernel_constexprs), with the fp16 config's tiles."""
    job = _aot_block.make_block_plan((90,))[0]
    sig, consts = job.signature()
    params = list(inspect.signature(_block_kernel._vit_block.fn).parameters)
    assert list(sig) == params
    assert [n for n, t in sig.items() if t != "constexpr"] == params[: len(params) - len(consts)]
    cfg = ENGINE_CONFIGS["fp16"]
    assert consts["BM"] == cfg.bm and consts["SPLIT_FC2"] == cfg.split_fc2 and consts["BLOCK_D"] == 64
    assert consts["HAS_QKV_B"] and consts["HAS_FC2_B"] and consts["CLS_ATTN"] == job.cls_attn
    assert sig["X"] == sig["Y"] == sig["Ln1W"] == f"*{job.stream_dtype}"
    assert sig["Wqkv"] == "*fp16" and sig["CU"] == "*i64" and sig["Ctr"] == "*i32" and sig["eps"] == "fp32"
    assert (job.num_warps, job.num_stages) == (cfg.num_warps, cfg.num_stages)


def test_cache_key_follows_every_kernel_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job = _aot_block.make_block_plan((90,))[0]
    assert job.source.name == "_block_kernel.py"
    assert {p.name for p in job.extra_sources} == {"_block_config.py", "_kernel.py", "_linear_kernel.py"}
    key = _aot.cache_key(job)
    assert _aot.cache_key(replace(job, block_c=2048)) != key
    fake = tmp_path / "_kernel.py"
    fake.write_text("# another attention kernel\n")
    monkeypatch.setattr(_aot_block, "_DEPENDENCIES", (("raggedvit.kernels._kernel", fake),))
    assert _aot.cache_key(job) != key


def test_compiles_for_sm90_without_a_gpu(tmp_path: Path) -> None:
    """One cubin through the stub driver (compile_job, no cache), and its cuobjdump report: no spills."""
    job = next(j for j in _aot_block.make_block_plan((90,)) if j.cls_attn and j.stream_dtype == "fp16")
    result, cached = _aot.compile_job(job, tmp_path)
    assert not cached and result.function_name == "_vit_block" and len(result.cubin) > 0
    assert result.num_params == 38 + 2  # the launcher's args (block_launcher.cc): 38 + Triton's 2 scratch pointers
    report = _aot_block.block_report(result.cubin, result.function_name)
    assert 0 < report["registers"] <= 255 and report["local_bytes"] == 0
    again, cached = _aot.compile_job(job, tmp_path)
    assert cached and again.cubin == result.cubin
