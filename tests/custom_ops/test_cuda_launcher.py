"""cuda/launcher.cc against a fake libcuda.so.1 (no GPU): image choice, launch parameters, context handling,
module cache, error statuses. The fake logs every driver call; the harness has a hand-written kernel table."""

from __future__ import annotations

import ctypes
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
import triton

from raggedvit.kernels._config import fwd_grid

HERE = Path(__file__).resolve().parent
CUDA_SRC = HERE.parents[1] / "raggedvit" / "custom_ops" / "cuda"
CUDA_H = Path(triton.__file__).parent / "backends" / "nvidia" / "include"

pytestmark = pytest.mark.skipif(shutil.which("g++") is None or shutil.which("gcc") is None, reason="needs gcc")


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("fake_cuda")
    (d / "lib").mkdir()
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-O1",
            "-o",
            str(d / "lib" / "libcuda.so.1"),
            str(HERE / "fake_cuda" / "fake_libcuda.c"),
        ],
        check=True,
    )
    subprocess.run(
        [
            "g++",
            "-std=c++17",
            "-O1",
            "-Wall",
            f"-I{CUDA_H}",
            f"-I{CUDA_SRC}",
            str(HERE / "fake_cuda" / "launcher_harness.cc"),
            str(CUDA_SRC / "launcher.cc"),
            str(CUDA_SRC / "linear_launcher.cc"),
            str(CUDA_SRC / "norm_launcher.cc"),
            str(CUDA_SRC / "select_launcher.cc"),
            str(CUDA_SRC / "gelu_launcher.cc"),
            str(CUDA_SRC / "embed_launcher.cc"),
            str(CUDA_SRC / "merge_launcher.cc"),
            "-ldl",
            "-o",
            str(d / "harness"),
        ],
        check=True,
    )
    return d


def run(harness: Path, tmp_path: Path, scenarios: list[str], *, fake: bool = True, **env: str):
    """Runs the scenarios in one process; returns (result lines, fake driver log lines)."""
    log = tmp_path / "driver.log"
    log.unlink(missing_ok=True)
    full_env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    full_env.update(env, FAKE_CUDA_LOG=str(log))
    if fake:
        full_env["LD_LIBRARY_PATH"] = str(harness / "lib")
    proc = subprocess.run(
        [str(harness / "harness")],
        input="\n".join(scenarios) + "\n",
        capture_output=True,
        text=True,
        env=full_env,
        timeout=60,
        check=True,
    )
    return proc.stdout.splitlines(), (log.read_text().splitlines() if log.exists() else [])


def scenario(
    *, dtype=1, index=0, T=100, B=3, H=12, D=64, cls=1, stream=0, device=0, misalign=0, scale=0.125, pos=None,
    key_bias=0,
):  # fmt: skip
    """pos: (flag, grid_h, grid_w, num_prefix), flag 1 = pos_table and token_pos, 2 = token_pos misaligned;
    key_bias 1: a key bias at 0x1100000, 2: misaligned."""
    line = f"{dtype} {index} {T} {B} {H} {D} {cls} {stream} {device} {misalign} {scale}"
    if pos is None and key_bias:
        pos = (0, 0, 0, 0)
    line = line if pos is None else line + " " + " ".join(map(str, pos))
    return line + f" {key_bias}" if key_bias else line


def launches(log: list[str]) -> list[dict[str, str]]:
    out = []
    for line in log:
        if line.startswith("launch "):
            parts = line.split()
            out.append({"name": parts[1], "image": parts[2], **dict(p.split("=", 1) for p in parts[3:])})
    return out


def test_launch_parameters_match_the_kernel_signatures(harness, tmp_path):
    res, log = run(harness, tmp_path, [scenario(T=100, B=3, H=12, D=64, scale=0.125)])
    assert res == ["OK"]
    fwd, cls = launches(log)
    bits = struct.unpack("<i", struct.pack("<f", 0.125))[0]
    assert fwd["name"] == "_ragged_attn_fwd" and fwd["image"].endswith("/sm90/min0")
    # J = cdiv(cdiv(100, 3), 32) = 2 programs per sequence, then cdiv(100, 4 * 32) for the dead rows; H
    assert fwd_grid(100, 3, 32) == (2, 7)
    assert fwd["grid"] == "7,12,1" and fwd["block"] == "128,1,1" and fwd["smem"] == "16384"
    # QKV, Bias (no bias: QKV's pointer, never read), CU, Out, Lse, PosTable, TokPos, KeyBias (no pos, no key bias:
    # QKV's and CU's pointers, never read), T, B, J, H, D, scale_bits, store_lse, has_bias, grid_h, grid_w,
    # num_prefix, global_scratch, profile_scratch
    assert fwd["args"] == (
        f"a00000,a00000,b00000,c00000,d00000,a00000,b00000,a00000,100,3,2,12,64,{bits},1,0,0,0,0,0,0"
    )
    assert cls["name"] == "_ragged_cls_attn" and cls["grid"] == "1,1,1"  # cdiv(100, 128)
    # QKV, Bias, CU, Lse, ClsAttn, PosTable, TokPos, KeyBias, T, B, H, D, scale_bits, has_bias, grid_h, grid_w,
    # num_prefix, global_scratch, profile_scratch
    assert cls["args"] == f"a00000,a00000,b00000,d00000,e00000,a00000,b00000,a00000,100,3,12,64,{bits},0,0,0,0,0,0"
    assert "/posfalse/kbfalse/" in fwd["image"] and "/posfalse/kbfalse/" in cls["image"]


def test_key_bias_images_and_parameters(harness, tmp_path):
    """A key bias picks the HAS_KEY_BIAS cubins and is passed after TokPos in both kernels."""
    res, log = run(harness, tmp_path, [scenario(key_bias=1)])
    assert res == ["OK"]
    fwd, cls = launches(log)
    assert fwd["image"] == "kForward/kFloat16/kInt32/d64/posfalse/kbtrue/sm90/min0" and "/kbtrue/" in cls["image"]
    assert fwd["args"].split(",")[5:8] == ["a00000", "b00000", "1100000"]
    assert cls["args"].split(",")[5:8] == ["a00000", "b00000", "1100000"]


def test_relative_position_images_and_parameters(harness, tmp_path):
    res, log = run(harness, tmp_path, [scenario(pos=(1, 14, 14, 1)), scenario(pos=(1, 3, 5, 0), cls=0)])
    assert res == ["OK", "OK"]
    fwd, cls, fwd2 = launches(log)
    assert fwd["image"] == "kForward/kFloat16/kInt32/d64/postrue/kbfalse/sm90/min0" and "/postrue/" in cls["image"]
    bits = struct.unpack("<i", struct.pack("<f", 0.125))[0]
    assert fwd["args"] == (
        f"a00000,a00000,b00000,c00000,d00000,f00000,f80000,a00000,100,3,2,12,64,{bits},1,0,14,14,1,0,0"
    )
    assert cls["args"] == f"a00000,a00000,b00000,d00000,e00000,f00000,f80000,a00000,100,3,12,64,{bits},0,14,14,1,0,0"
    assert fwd2["args"].endswith(",0,0,3,5,0,0,0") and "/postrue/" in fwd2["image"]
    assert fwd["stream"] == cls["stream"] == "5000" and fwd["ctx"] == "0"


def test_config_follows_T_and_large_shared_memory_is_opted_in_once(harness, tmp_path):
    res, log = run(harness, tmp_path, [scenario(T=2047, cls=0), scenario(T=2048, cls=0), scenario(T=9000, cls=0)])
    assert res == ["OK"] * 3
    images = [x["image"] for x in launches(log)]
    assert images == [f"kForward/kFloat16/kInt32/d64/posfalse/kbfalse/sm90/min{m}" for m in ("0", "2048", "2048")]
    grids = [f"{fwd_grid(T, 3, m)[1]},12,1" for T, m in ((2047, 32), (2048, 64), (9000, 64))]
    assert [x["grid"] for x in launches(log)] == grids
    assert [x for x in log if x.startswith("setattr")] == [
        "setattr kForward/kFloat16/kInt32/d64/posfalse/kbfalse/sm90/min2048 attr=8 value=60000"
    ]
    assert len([x for x in log if x.startswith("load")]) == 2  # one module per image and context


@pytest.mark.parametrize(("arch", "expect"), [(80, "sm80"), (86, "sm86"), (87, "sm86"), (89, "sm86"), (90, "sm90")])
def test_cubin_choice_by_compute_capability(harness, tmp_path, arch, expect):
    res, log = run(harness, tmp_path, [scenario()], FAKE_CUDA_ARCH=str(arch))
    assert res == ["OK"]
    assert all(f"/{expect}/" in x["image"] for x in launches(log))


@pytest.mark.parametrize("arch", [70, 100, 120])
def test_no_cubin_for_other_majors(harness, tmp_path, arch):
    res, log = run(harness, tmp_path, [scenario()], FAKE_CUDA_ARCH=str(arch))
    assert res[0].startswith(f"ERR no cubin for sm_{arch} fp16/int32 BLOCK_D=64") and "sm_80, sm_86, sm_90" in res[0]
    assert not launches(log)


def test_null_stream_uses_the_primary_context_and_restores_it(harness, tmp_path):
    res, log = run(
        harness, tmp_path, [scenario(stream=-1, device=1), scenario(stream=-1, device=1)], FAKE_CUDA_DEVICES="2"
    )
    assert res == ["OK", "OK"]
    assert log.count("retain 1") == 1
    assert log.count("push 1") == log.count("pop 1") == 2
    assert all(x["ctx"] == "1" and x["stream"] == "0" for x in launches(log))


def test_stream_of_another_device(harness, tmp_path):
    res, log = run(harness, tmp_path, [scenario(stream=1, device=1)], FAKE_CUDA_DEVICES="2")
    assert res == ["OK"] and all(x["ctx"] == "1" for x in launches(log))


def test_empty_grid_launches_nothing(harness, tmp_path):
    res, log = run(harness, tmp_path, [scenario(T=0, B=0), scenario(T=0, B=4, D=40)])
    assert res == ["OK", "OK"] and log == []


@pytest.mark.parametrize(
    ("kw", "env", "message"),
    [
        ({"D": 40}, {}, "ERR head dim D = 40 is not supported by the CUDA kernels"),
        ({"D": 16}, {}, "ERR head dim D = 16 is not supported"),
        ({"D": 256}, {}, "ERR head dim D = 256 is not supported"),
        ({"misalign": 8}, {}, "ERR device buffer 'qkv' is not 16-byte aligned"),
        ({"T": 3_000_000, "H": 12, "D": 64}, {}, "exceed the int32 indexing"),
        ({"B": 2**31 - 1}, {}, "ERR T = 100, B = 2147483647: B * 1 + 1 query-tile programs exceed the CUDA grid limit"),
        ({"dtype": 2, "D": 32}, {}, "ERR _ragged_attn_fwd: cubin expects 14 parameters, launcher passes 21"),
        ({"key_bias": 1}, {"FAKE_CUDA_ARCH": "80"}, "ERR no cubin for sm_80 fp16/int32 BLOCK_D=64 with key bias"),
        ({"key_bias": 2}, {}, "ERR device buffer 'key_bias' is not 16-byte aligned"),
        (
            {"pos": (1, 14, 14, 1)},
            {"FAKE_CUDA_ARCH": "80"},
            "ERR no cubin for sm_80 fp16/int32 BLOCK_D=64 with relative",
        ),
        ({"pos": (2, 14, 14, 1)}, {}, "ERR device buffer 'token_pos' is not 16-byte aligned"),
        ({"pos": (1, 0, 14, 1)}, {}, "ERR relative position grid 0x14"),
        ({"pos": (1, 2**31, 2, 0)}, {}, "must be in the kernel's int32 range"),
        ({"pos": (1, 20000, 20000, 1)}, {}, "must be in the kernel's int32 range"),  # H * R = 12 * 1.6e9
        (
            {},
            {"FAKE_CUDA_LAUNCH_ERR": "700"},
            "ERR cuLaunchKernel(_ragged_attn_fwd) failed: CUDA_ERROR_ILLEGAL_ADDRESS",
        ),
        ({}, {"FAKE_CUDA_LOAD_ERR": "209"}, "ERR cuModuleLoadData failed: CUDA_ERROR_NO_BINARY_FOR_GPU (209)"),
        ({"dtype": 0, "index": 1, "D": 128, "T": 10}, {"FAKE_CUDA_SMEM_OPTIN": "49152"}, None),
        ({"T": 5000}, {"FAKE_CUDA_SMEM_OPTIN": "49152"}, "needs 60000 bytes of shared memory; the device allows 49152"),
        ({"stream": -1, "device": 3}, {}, "ERR cuDeviceGet failed: CUDA_ERROR_UNKNOWN (101)"),
    ],
)
def test_errors_are_returned_as_text(harness, tmp_path, kw, env, message):
    res, log = run(harness, tmp_path, [scenario(**kw)], **env)
    if message is None:  # fp32 D=128 needs 53248 > 49152 bytes
        assert res[0] == "ERR _ragged_attn_fwd needs 53248 bytes of shared memory; the device allows 49152"
    else:
        assert message in res[0], res[0]


def _real_libcuda() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


@pytest.mark.skipif(_real_libcuda(), reason="a real libcuda.so.1 is installed")
def test_without_libcuda(harness, tmp_path):
    res, _ = run(harness, tmp_path, [scenario()], fake=False)
    assert res[0].startswith("ERR cannot load libcuda.so.1")


def linear(*, dtype=1, index=0, T=100, N=512, K=192, B=2, bias=1, residual=1, cu=1, activation=1, misalign=0) -> str:
    return f"L {dtype} {index} {T} {N} {K} {B} {bias} {residual} {cu} {activation} {misalign}"


def test_linear_launch_parameters(harness, tmp_path):
    res, log = run(harness, tmp_path, [linear(), linear(bias=0, residual=0, cu=0, activation=0)])
    assert res == ["OK", "OK"]
    full, bare = launches(log)
    assert full["name"] == "_ragged_linear" and full["image"] == "linear/kFloat16/kInt32/sm90/kSmallNarrow"
    assert full["grid"] == "32,1,1" and full["block"] == "128,1,1"  # cdiv(100, 64) * cdiv(512, 32)
    # X, W, Bias, Res, CU, Y, T, N, K, B, has_bias, has_res, has_live, activation, global/profile scratch
    assert full["args"] == "a00000,a80000,b80000,c80000,b00000,c00000,100,512,192,2,1,1,1,1,0,0"
    # absent optional inputs: X's pointer stands in, never read
    assert bare["args"] == "a00000,a80000,a00000,a00000,a00000,c00000,100,512,192,2,0,0,0,0,0,0"


@pytest.mark.parametrize(
    ("arch", "T", "N", "cu", "image", "grid"),
    [
        (90, 100, 1024, 1, "sm90/kSmallNarrow", "64,1,1"),
        (90, 100, 1040, 1, "sm90/kSmallWide", "34,1,1"),
        # sm_90 from LARGE_T rows: the persistent TMA kernel, min(2 x SMs, tiles) programs (cdiv(1024, 64) * 6 = 96)
        (90, 1024, 768, 0, "sm90/kTma", "96,1,1"),
        (90, 1024, 768, 1, "sm90/kTma", "96,1,1"),
        (90, 25216, 3072, 1, "sm90/kTma", "264,1,1"),  # 394 * 24 tiles: two programs per SM
        (80, 1024, 768, 0, "sm80/kSmallWide", "192,1,1"),  # kLarge skipped for sm_80: the next smaller config
        (89, 2000, 64, 0, "sm80/kSmallWide", "32,1,1"),
        # below sm_90, a live count (capacity layout) from LARGE_T rows: 64 x 64 tiles up to CAPACITY_NARROW_N columns
        (80, 1024, 768, 1, "sm80/kSmallWide", "192,1,1"),
        (80, 1024, 1536, 1, "sm80/kSmallWide", "384,1,1"),
        (90, 1023, 768, 1, "sm90/kSmallNarrow", "384,1,1"),
    ],
)
def test_linear_config_rule_and_fallback(harness, tmp_path, arch, T, N, cu, image, grid):
    res, log = run(harness, tmp_path, [linear(T=T, N=N, cu=cu)], FAKE_CUDA_ARCH=str(arch))
    assert res == ["OK"]
    (launch,) = launches(log)
    assert launch["image"] == f"linear/kFloat16/kInt32/{image}" and launch["grid"] == grid


def test_linear_tma_launch_parameters(harness, tmp_path):
    res, log = run(harness, tmp_path, [linear(T=1100, N=768, K=192), linear(T=1100, bias=0, residual=0, cu=0)],
                   FAKE_CUDA_SMS="8")  # fmt: skip
    assert res == ["OK", "OK"]
    full, bare = launches(log)
    assert full["name"] == "_ragged_linear_tma" and full["image"] == "linear/kFloat16/kInt32/sm90/kTma"
    assert full["grid"] == "16,1,1" and full["block"] == "128,1,1"  # min(2 x SMs, cdiv(1100, 64) * cdiv(768, 128))
    # the maps of X, W, Residual and Y (base, cols, rows, box cols, box rows, fp16 = 6, 128-byte swizzle = 3), each
    # with its int32 sizes and int64 strides, then Bias, CU, T, N, K, B, has_bias, has_res, has_live, activation,
    # programs, global/profile scratch
    assert full["args"] == (
        "map(a00000,192,1100,64,64,t6,s3),1100,192,192,1,map(a80000,192,768,64,128,t6,s3),768,192,192,1,"
        "map(c80000,768,1100,64,64,t6,s3),1100,768,768,1,map(c00000,768,1100,64,64,t6,s3),1100,768,768,1,"
        "b80000,b00000,1100,768,192,2,1,1,1,1,16,0,0"
    )
    # no Residual: Y's map stands in (never read); no Bias / CU: X's pointer (never read)
    assert "map(c00000,512,1100,64,64,t6,s3),1100,512,512,1,map(c00000,512,1100" in bare["args"]
    assert bare["args"].endswith("a00000,a00000,1100,512,192,2,0,0,0,1,16,0,0")


@pytest.mark.parametrize(
    ("kw", "env", "message"),
    [
        ({"dtype": 2}, {}, "_ragged_linear_tma: cubin expects 32 parameters, launcher passes 33"),
        ({}, {"FAKE_CUDA_TMA_ERR": "1"}, "cuTensorMapEncodeTiled(X [1100, 192], box 64 x 64) failed"),
    ],
)
def test_linear_tma_errors(harness, tmp_path, kw, env, message):
    res, log = run(harness, tmp_path, [linear(T=1100, **kw)], **env)
    assert res[0].startswith("ERR ") and message in res[0], res
    assert not launches(log)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"K": 200}, "K = 200 and N = 512 must be multiples of 16"),
        ({"N": 100}, "K = 192 and N = 100 must be multiples of 16"),
        ({"misalign": 8}, "device buffer 'X' is not 16-byte aligned"),
        ({"dtype": 0}, "element type fp32 has no CUDA kernel"),
        ({"index": 1}, "no RaggedLinear cubin for sm_90 fp16/int64"),
        ({"dtype": 2, "index": 1}, "_ragged_linear: cubin expects 15 parameters, launcher passes 16"),
        ({"T": 2**31}, "exceed the int32 sizes of the kernel"),
    ],
)
def test_linear_errors(harness, tmp_path, kw, message):
    res, log = run(harness, tmp_path, [linear(**kw)])
    assert res[0].startswith("ERR ") and message in res[0], res
    assert not launches(log)


def test_linear_empty_launches_nothing(harness, tmp_path):
    res, log = run(harness, tmp_path, [linear(T=0), linear(N=0)])
    assert res == ["OK", "OK"] and not launches(log)


def gelu(*, dtype=1, M=100, N=512, bias=1, misalign=0) -> str:
    return f"G {dtype} {M} {N} {bias} {misalign}"


def test_gelu_launch_parameters(harness, tmp_path):
    res, log = run(harness, tmp_path, [gelu(), gelu(bias=0)])
    assert res == ["OK", "OK"]
    full, bare = launches(log)
    assert full["name"] == "_bias_gelu" and full["image"] == "gelu/kFloat16/sm90/kSmall"
    assert full["grid"] == "100,1,1" and full["block"] == "128,1,1"  # cdiv(100, 1) * cdiv(512, 1024)
    # X, Bias, Y, M, N, has_bias, global/profile scratch
    assert full["args"] == "a00000,b00000,c00000,100,512,1,0,0"
    assert bare["args"] == "a00000,a00000,c00000,100,512,0,0,0"  # absent bias: X's pointer stands in, never read


@pytest.mark.parametrize(
    ("arch", "M", "N", "image", "grid"),
    [
        (90, 1023, 3072, "sm90/kSmall", "3069,1,1"),
        (90, 1024, 3072, "sm90/kLarge", "768,1,1"),  # cdiv(1024, 8) * cdiv(3072, 512)
        (89, 2000, 1536, "sm80/kLarge", "750,1,1"),  # no sm_89 image: the highest minor of the same major
    ],
)
def test_gelu_config_rule_by_rows_and_arch(harness, tmp_path, arch, M, N, image, grid):
    res, log = run(harness, tmp_path, [gelu(M=M, N=N)], FAKE_CUDA_ARCH=str(arch))
    assert res == ["OK"]
    (launch,) = launches(log)
    assert launch["image"] == f"gelu/kFloat16/{image}" and launch["grid"] == grid


@pytest.mark.parametrize(
    ("kw", "env", "message"),
    [
        ({"N": 40}, {}, "N = 40 must be a multiple of 16"),
        ({"misalign": 8}, {}, "device buffer 'X' is not 16-byte aligned"),
        ({"dtype": 0}, {}, "element type fp32 has no CUDA kernel"),
        ({"dtype": 2}, {}, "_bias_gelu: cubin expects 7 parameters, launcher passes 8"),
        ({"dtype": 2, "M": 2000}, {}, "no BiasGelu cubin for sm_90 bf16 config large"),
        ({"M": 2**31}, {}, "exceed the int32 sizes of the kernel"),
        ({}, {"FAKE_CUDA_ARCH": "75"}, "no BiasGelu cubin for sm_75"),
    ],
)
def test_gelu_errors(harness, tmp_path, kw, env, message):
    res, log = run(harness, tmp_path, [gelu(**kw)], **env)
    assert res[0].startswith("ERR ") and message in res[0], res
    assert not launches(log)


def test_gelu_empty_launches_nothing(harness, tmp_path):
    res, log = run(harness, tmp_path, [gelu(M=0), gelu(N=0)])
    assert res == ["OK", "OK"] and not launches(log)


def select(*, T=100, B=2, width=64, bound=40, num_prefix=1, policy=0, keep=0.5, mass=0.9, misalign=0) -> str:
    """misalign i > 0: the i-th buffer of scores, cu, k, src, cu_new, seq_id, pos is 8 bytes off."""
    return f"S {T} {B} {width} {bound} {num_prefix} {policy} {keep} {mass} {misalign}"


def _bits(v: float) -> int:
    return struct.unpack("<i", struct.pack("<f", v))[0]


def test_select_launch_parameters(harness, tmp_path):
    res, log = run(harness, tmp_path, [select(), select(T=7, B=5, policy=1, keep=0.25, mass=0.75)])
    assert res == ["OK", "OK"]
    count, scatter, count2, scatter2 = launches(log)
    assert count["name"] == "_select_count" and count["image"] == "select/kCount/sm90/w256"
    assert scatter["name"] == "_select_scatter" and scatter["image"] == "select/kScatter/sm90/w256"
    # grid (B,), 32 * the table's num_warps threads, the table's shared bytes
    assert count["grid"] == scatter["grid"] == "2,1,1" and count2["grid"] == scatter2["grid"] == "5,1,1"
    assert count["block"] == scatter["block"] == "256,1,1"
    assert count["smem"] == "0" and scatter["smem"] == "1024"
    assert count["stream"] == scatter["stream"] == "5000"
    # Scores, CU, K, T, B, W, num_prefix, policy, keep_bits, mass_bits, global/profile scratch
    assert count["args"] == f"a00000,b00000,b40000,100,2,64,1,0,{_bits(0.5)},{_bits(0.9)},0,0"
    assert count2["args"] == f"a00000,b00000,b40000,7,5,64,1,1,{_bits(0.25)},{_bits(0.75)},0,0"
    # Scores, CU, K, Src, CuNew, SeqId, Pos, T, B, W, bound, num_prefix, global/profile scratch
    assert scatter["args"] == "a00000,b00000,b40000,c00000,c40000,c80000,cc0000,100,2,64,40,1,0,0"
    assert len([x for x in log if x.startswith("load")]) == 2  # one module per kernel and context


def test_select_largest_int32_sizes_are_passed_through(harness, tmp_path):
    n = 2**31 - 1024  # the launcher's limit (slot indices j < W + BLOCK stay int32)
    res, log = run(harness, tmp_path, [select(T=n, width=n, bound=n, num_prefix=n)])
    assert res == ["OK"]
    count, scatter = launches(log)
    assert count["args"].startswith(f"a00000,b00000,b40000,{n},2,{n},{n},0,")
    assert scatter["args"].endswith(f",{n},2,{n},{n},{n},0,0")


@pytest.mark.parametrize(
    ("width", "image", "block"),
    [(1, "w256", "256,1,1"), (256, "w256", "256,1,1"), (257, "w512", "64,1,1"), (512, "w512", "64,1,1"),
     (513, "w1024", "512,1,1"), (1024, "w1024", "512,1,1"), (5000, "w1024", "512,1,1")],
)  # fmt: skip
def test_select_cubin_choice_by_width(harness, tmp_path, width, image, block):
    # the smallest sort width >= the image width, else the widest (its pairwise path), on every launch
    res, log = run(harness, tmp_path, [select(width=width, bound=1)] * 2)
    assert res == ["OK", "OK"]
    for launch in launches(log):
        assert launch["image"].endswith(f"/sm90/{image}") and launch["block"] == block
    assert len([x for x in log if x.startswith("load")]) == 2  # a module per image and context, loaded once


@pytest.mark.parametrize(
    ("arch", "image", "block"),
    [(90, "sm90/w256", "256,1,1"), (80, "sm80/w256", "128,1,1"), (86, "sm80/w256", "128,1,1"),
     (89, "sm80/w256", "128,1,1")],
)  # fmt: skip
def test_select_cubin_choice_by_compute_capability(harness, tmp_path, arch, image, block):
    res, log = run(harness, tmp_path, [select()], FAKE_CUDA_ARCH=str(arch))
    assert res == ["OK"]
    count, scatter = launches(log)
    assert count["image"] == f"select/kCount/{image}" and scatter["image"] == f"select/kScatter/{image}"
    assert count["block"] == scatter["block"] == block


@pytest.mark.parametrize(
    ("kw", "env", "message"),
    [
        ({}, {"FAKE_CUDA_ARCH": "70"}, "no RaggedSelect cubin for sm_70 in this library (rebuild with build.py"),
        ({}, {"FAKE_CUDA_ARCH": "120"}, "no RaggedSelect cubin for sm_120 in this library"),
        ({}, {"FAKE_CUDA_ARCH": "75"}, "_select_count: cubin expects 11 parameters, launcher passes 12"),
        ({"B": 0}, {}, "sizes must be T >= 0, B >= 1, 0 <= bound <= width, width >= 1, num_prefix >= 0, got T = 100"),
        ({"T": -1}, {}, "sizes must be"),
        ({"width": 0, "bound": 0}, {}, "sizes must be"),
        ({"bound": 65}, {}, "got T = 100, B = 2, width = 64, bound = 65, num_prefix = 1"),
        ({"bound": -1}, {}, "sizes must be"),
        ({"num_prefix": -1}, {}, "sizes must be"),
        ({"T": 2**31 - 1023}, {}, "T = 2147482625, B = 2, width = 64, bound = 40, num_prefix = 1 exceed the int32"),
        ({"B": 2**31}, {}, "B = 2147483648, width = 64, bound = 40, num_prefix = 1 exceed the int32 sizes"),
        ({"width": 2**31, "bound": 0}, {}, "width = 2147483648, bound = 0, num_prefix = 1 exceed the int32 sizes"),
        ({"width": 2**32, "num_prefix": 2**31}, {}, "exceed the int32 sizes of the kernels"),
        ({"policy": 2}, {}, "policy must be 0 or 1, got 2"),
        ({"misalign": 1}, {}, "device buffer 'scores' is not 16-byte aligned"),
        ({"misalign": 2}, {}, "device buffer 'cu' is not 16-byte aligned"),
        ({"misalign": 7}, {}, "device buffer 'pos' is not 16-byte aligned"),
        ({}, {"FAKE_CUDA_LAUNCH_ERR": "700"}, "cuLaunchKernel(_select_count) failed: CUDA_ERROR_ILLEGAL_ADDRESS"),
        ({}, {"FAKE_CUDA_LOAD_ERR": "209"}, "cuModuleLoadData failed: CUDA_ERROR_NO_BINARY_FOR_GPU (209)"),
    ],
)
def test_select_errors_launch_nothing(harness, tmp_path, kw, env, message):
    res, log = run(harness, tmp_path, [select(**kw)], **env)
    assert res[0].startswith("ERR ") and message in res[0], res
    assert not launches(log)


def test_select_wrong_parameter_count_of_the_second_kernel(harness, tmp_path):
    # both kernels' counts are checked before the first launch: nothing is enqueued
    res, log = run(harness, tmp_path, [select()], FAKE_CUDA_ARCH="100")
    assert res == ["ERR _select_scatter: cubin expects 13 parameters, launcher passes 14"]
    assert launches(log) == []


def norm(*, dtype=1, index=0, T=300, R=200, D=768, B=0, skip=1, bias=1, cu=0, misalign=0) -> str:
    """misalign i > 0: the i-th buffer of X, Skip, Bias, Index, Gamma, Beta, CuSeqlens, Normed, Sum is 8 bytes off."""
    return f"N {dtype} {index} {T} {R} {D} {B} {skip} {bias} {cu} {misalign}"


_EPS = struct.unpack("<i", struct.pack("<f", 1e-6))[0]


def test_norm_launch_parameters(harness, tmp_path):
    res, log = run(harness, tmp_path, [norm(), norm(skip=0, bias=0), norm(B=4, cu=1), norm(index=1, B=2, cu=1)])
    assert res == ["OK"] * 4
    full, bare, live, live64 = launches(log)
    assert full["name"] == "_gather_layer_norm" and full["image"] == "norm/kFloat16/kInt32/sm90/d1024"
    assert full["grid"] == "100,1,1" and full["block"] == "128,1,1"  # cdiv(200, BLOCK_R 2), 4 warps
    # X, Skip, Bias, Index, Gamma, Beta, CU, Normed, Sum, T, R, D, B, eps bits, has_skip, has_bias, has_live,
    # global/profile scratch; absent CU: X's pointer stands in, never read (has_live 0)
    ptrs = "b00000,b40000,b80000,bc0000"
    assert full["args"] == f"a00000,a80000,{ptrs},a00000,c00000,c80000,300,200,768,0,{_EPS},1,1,0,0,0"
    # absent Skip / Bias: X's pointer stands in, never read
    assert bare["args"] == f"a00000,a00000,a00000,{ptrs[7:]},a00000,c00000,c80000,300,200,768,0,{_EPS},0,0,0,0,0"
    # CuSeqlens [B+1]: its pointer, B and has_live; every program is launched (the kernel reads the live count)
    assert live["image"] == "norm/kFloat16/kInt32/sm90/d1024" and live["grid"] == "100,1,1"
    assert live["args"] == f"a00000,a80000,{ptrs},be0000,c00000,c80000,300,200,768,4,{_EPS},1,1,1,0,0"
    assert live64["image"] == "norm/kFloat16/kInt64/sm90/d1024"
    assert live64["args"].endswith(f",be0000,c00000,c80000,300,200,768,2,{_EPS},1,1,1,0,0")


@pytest.mark.parametrize(
    ("arch", "index", "D", "image", "grid"),
    [
        (90, 0, 16, "kInt32/sm90/d256", "25,1,1"),  # cdiv(200, 8)
        (90, 0, 256, "kInt32/sm90/d256", "25,1,1"),
        (90, 0, 272, "kInt32/sm90/d512", "50,1,1"),
        (90, 0, 1024, "kInt32/sm90/d1024", "100,1,1"),
        (89, 0, 256, "kInt32/sm80/d256", "25,1,1"),  # the same major's highest minor <= the device's
        (90, 1, 256, "kInt64/sm90/d256", "25,1,1"),  # the CuSeqlens type's images only
        (90, 1, 272, "kInt64/sm90/d1024", "100,1,1"),  # no int64 d512: the next wider int64 image
    ],
)
def test_norm_picks_the_smallest_block_d(harness, tmp_path, arch, index, D, image, grid):
    res, log = run(harness, tmp_path, [norm(D=D, index=index, cu=index, B=1)], FAKE_CUDA_ARCH=str(arch))
    assert res == ["OK"]
    (launch,) = launches(log)
    assert launch["image"] == f"norm/kFloat16/{image}" and launch["grid"] == grid


@pytest.mark.parametrize(
    ("kw", "env", "message"),
    [
        ({"D": 200}, {}, "D = 200 must be a multiple of 16"),
        ({"D": 1040}, {}, "D = 1040 exceeds the widest compiled row of this library (1024 columns)"),
        ({"D": 512}, {"FAKE_CUDA_ARCH": "80"}, "no GatherLayerNorm cubin for sm_80 fp16/int32 and D = 512"),
        ({"index": 1, "cu": 1, "D": 256}, {"FAKE_CUDA_ARCH": "80"},
         "no GatherLayerNorm cubin for sm_80 fp16/int64 and D = 256"),
        ({"misalign": 4}, {}, "device buffer 'Index' is not 16-byte aligned"),
        ({"misalign": 7, "cu": 1}, {}, "device buffer 'CuSeqlens' is not 16-byte aligned"),
        ({"misalign": 9}, {}, "device buffer 'Sum' is not 16-byte aligned"),
        ({"dtype": 0}, {}, "element type fp32 has no CUDA kernel"),
        ({"dtype": 2, "D": 256}, {}, "_gather_layer_norm: cubin expects 18 parameters, launcher passes 19"),
        ({"T": 2**31}, {}, "exceed the int32 sizes of the kernel"),
        ({"B": 2**31, "cu": 1}, {}, "D = 768, B = 2147483648 exceed the int32 sizes of the kernel"),
        ({"R": -1}, {}, "sizes must be >= 0"),
        ({"B": -1}, {}, "sizes must be >= 0, got T = 300, R = 200, D = 768, B = -1"),
    ],
)  # fmt: skip
def test_norm_errors(harness, tmp_path, kw, env, message):
    res, log = run(harness, tmp_path, [norm(**kw)], **env)
    assert res[0].startswith("ERR ") and message in res[0], res
    assert not launches(log)


def test_norm_largest_int32_sizes_are_passed_through(harness, tmp_path):
    n = 2**31 - 64  # the launcher's row limit (the last program's rows stay int32)
    res, log = run(harness, tmp_path, [norm(T=n, R=n, D=16, B=2**31 - 1, cu=1)])
    assert res == ["OK"]
    (launch,) = launches(log)
    assert launch["grid"] == f"{n // 8},1,1" and f",{n},{n},16,{2**31 - 1},{_EPS},1,1,1,0,0" in launch["args"]


def test_norm_empty_launches_nothing(harness, tmp_path):
    res, log = run(harness, tmp_path, [norm(R=0), norm(T=0, R=0), norm(R=0, cu=1, B=3)])
    assert res == ["OK", "OK", "OK"] and not launches(log)


def embed(*, dtype=0, B=1, C=3, H=224, W=224, patch=16, P=1, N=768, misalign=0) -> str:
    """misalign i > 0: the i-th buffer of Images, Weight, Prefix, Pos, Out is 8 bytes off."""
    return f"E {dtype} {B} {C} {H} {W} {patch} {P} {N} {misalign}"


def test_embed_launch_parameters(harness, tmp_path):
    res, log = run(harness, tmp_path, [embed(), embed(B=2, C=1, H=230, W=200, patch=14, P=0, N=64)])
    assert res == ["OK", "OK"]
    deit, crop = launches(log)
    assert deit["name"] == "_patch_embed" and deit["image"] == "embed/kFloat32/sm90/kSmall/alignedtrue"
    # (cdiv(B * L, BLOCK_M 32) + cdiv(B * P, 32)) * cdiv(N, BLOCK_N 64) = (7 + 1) * 12, the table's 4 warps
    assert deit["grid"] == "96,1,1" and deit["block"] == "128,1,1" and deit["smem"] == "20480"
    assert deit["stream"] == "5000" and deit["ctx"] == "0"
    # Img, W, Prefix, Pos, Out, B, C, H, Wd, gw, L, P, N, K = C * patch^2, patch, global/profile scratch
    assert deit["args"] == "a00000,a80000,b00000,b80000,c00000,1,3,224,224,14,196,1,768,768,16,0,0"
    # a crop (230 // 14 = 16 patch rows, 200 // 14 = 14 columns), patch 14: the unaligned image; no prefix tiles
    assert crop["image"] == "embed/kFloat32/sm90/kSmall/alignedfalse" and crop["grid"] == "14,1,1"  # cdiv(448, 32)
    assert crop["args"] == "a00000,a80000,b00000,b80000,c00000,2,1,230,200,14,224,0,64,196,14,0,0"
    assert len([x for x in log if x.startswith("load")]) == 2  # one module per image and context


@pytest.mark.parametrize(
    ("kw", "image", "grid", "block"),
    [
        ({"B": 1}, "kSmall/alignedtrue", "96,1,1", "128,1,1"),  # deit at B = 1: 196 rows
        ({"B": 4}, "kMid/alignedtrue", "84,1,1", "128,1,1"),  # 784 rows: (cdiv(784, 64) + 1) * cdiv(768, 128)
        ({"B": 128}, "kLarge/alignedtrue", "1182,1,1", "256,1,1"),  # 25088 rows: (196 + 1) * 6, 8 warps
        # EMBED_MID_M = 512 and EMBED_LARGE_M = 16384 rows of B * L (L = 2: a 16 x 32 image, patch 16)
        ({"B": 255, "C": 1, "H": 16, "W": 32, "P": 0, "N": 64}, "kSmall/alignedtrue", "16,1,1", "128,1,1"),
        ({"B": 256, "C": 1, "H": 16, "W": 32, "P": 0, "N": 64}, "kMid/alignedtrue", "8,1,1", "128,1,1"),
        ({"B": 8191, "C": 1, "H": 16, "W": 32, "P": 0, "N": 64}, "kMid/alignedtrue", "256,1,1", "128,1,1"),
        ({"B": 8192, "C": 1, "H": 16, "W": 32, "P": 0, "N": 64}, "kLarge/alignedtrue", "128,1,1", "256,1,1"),
        # prefix rows count towards the grid (their own tiles), not towards the config
        ({"B": 255, "C": 1, "H": 16, "W": 32, "P": 2, "N": 64}, "kSmall/alignedtrue", "32,1,1", "128,1,1"),
        # unaligned (patch 14: 16 x 16 patches): sm_90 has no unaligned kLarge, so the next smaller config
        ({"B": 1, "patch": 14}, "kSmall/alignedfalse", "108,1,1", "128,1,1"),  # (cdiv(256, 32) + 1) * 12
        ({"B": 128, "patch": 14}, "kMid/alignedfalse", "3084,1,1", "128,1,1"),  # (512 + 2) * 6
        ({"B": 128, "W": 232}, "kMid/alignedfalse", "2364,1,1", "128,1,1"),  # W % 16 != 0: (392 + 2) * 6
    ],
)
def test_embed_config_rule_by_rows(harness, tmp_path, kw, image, grid, block):
    res, log = run(harness, tmp_path, [embed(**kw)])
    assert res == ["OK"]
    (launch,) = launches(log)
    assert launch["image"] == f"embed/kFloat32/sm90/{image}" and launch["grid"] == grid and launch["block"] == block


@pytest.mark.parametrize(
    ("arch", "kw", "image"),
    [
        (80, {"B": 128}, "kFloat32/sm80/kLarge/alignedtrue"),
        (86, {"B": 1}, "kFloat32/sm86/kSmall/alignedtrue"),
        (87, {"B": 4}, "kFloat32/sm86/kMid/alignedtrue"),
        (89, {"B": 1}, "kFloat32/sm86/kSmall/alignedtrue"),  # no sm_89 image: the highest minor of the same major
        (89, {"B": 4}, "kFloat32/sm86/kMid/alignedtrue"),
        (90, {"dtype": 1, "B": 128}, "kFloat16/sm90/kLarge/alignedtrue"),
        (80, {"dtype": 1, "B": 128}, "kFloat16/sm80/kMid/alignedtrue"),  # no fp16 kLarge for sm_8x: kMid
        (89, {"dtype": 1, "B": 128}, "kFloat16/sm80/kMid/alignedtrue"),
        (89, {"dtype": 1, "B": 1}, "kFloat16/sm80/kSmall/alignedtrue"),
    ],
)
def test_embed_cubin_choice_by_compute_capability(harness, tmp_path, arch, kw, image):
    res, log = run(harness, tmp_path, [embed(**kw)], FAKE_CUDA_ARCH=str(arch))
    assert res == ["OK"]
    (launch,) = launches(log)
    assert launch["image"] == f"embed/{image}"


def test_embed_falls_back_to_the_next_smaller_config_of_the_picked_arch(harness, tmp_path):
    # sm_86 has no fp32 kLarge (as when the build skips it for shared memory) but sm_80 has one
    res, log = run(harness, tmp_path, [embed(B=128)], FAKE_CUDA_ARCH="89")
    assert res == ["OK"]
    (launch,) = launches(log)
    assert launch["image"] == "embed/kFloat32/sm86/kMid/alignedtrue"


@pytest.mark.parametrize(
    ("kw", "env", "message"),
    [
        ({"N": 40}, {}, "N = 40 must be a multiple of 16 on the CUDA EP"),
        ({"misalign": 1}, {}, "device buffer 'Images' is not 16-byte aligned"),
        ({"misalign": 2}, {}, "device buffer 'Weight' is not 16-byte aligned"),
        ({"misalign": 3}, {}, "device buffer 'Prefix' is not 16-byte aligned"),
        ({"misalign": 4}, {}, "device buffer 'Pos' is not 16-byte aligned"),
        ({"misalign": 5}, {}, "device buffer 'Out' is not 16-byte aligned"),
        ({"dtype": 2}, {}, "image element type bf16 has no CUDA kernel (float and float16 do)"),
        ({"B": 2**31}, {}, "B = 2147483648, C = 3, H = 224, W = 224, patch = 16, P = 1, N = 768 exceed the int32"),
        ({"C": 2**20, "H": 64, "W": 64}, {}, "exceed the int32 sizes of the kernel (pixels per image, K, rows)"),
        ({"N": 2**31}, {}, "exceed the int32 sizes of the kernel"),
        ({"P": 2**31}, {}, "exceed the int32 sizes of the kernel"),
        ({"C": 1, "H": 16, "W": 2**26, "N": 2**20}, {}, "the tiles exceed the int32 grid of the kernel"),
        ({"patch": 0}, {}, "sizes must be >= 0 and patch >= 1, got B = 1, C = 3, H = 224, W = 224, patch = 0"),
        ({"B": -1}, {}, "sizes must be >= 0"),
        ({"dtype": 1, "patch": 14}, {}, "_patch_embed: cubin expects 16 parameters, launcher passes 17"),
        (
            {},
            {"FAKE_CUDA_ARCH": "75"},
            "no PatchEmbed cubin for sm_75 fp32 images, config small or smaller (aligned), in this library (rebuild",
        ),
        ({"B": 128}, {"FAKE_CUDA_ARCH": "100"}, "no PatchEmbed cubin for sm_100 fp32 images, config large or smaller"),
        ({"dtype": 1, "patch": 14}, {"FAKE_CUDA_ARCH": "80"}, "no PatchEmbed cubin for sm_80 fp16 images, config"),
        ({"patch": 14}, {"FAKE_CUDA_ARCH": "86"}, "config small or smaller, in this library"),  # no "(aligned)"
        ({"B": 128}, {"FAKE_CUDA_SMEM_OPTIN": "65536"}, "_patch_embed needs 114688 bytes of shared memory; the"),
        ({}, {"FAKE_CUDA_LAUNCH_ERR": "700"}, "cuLaunchKernel(_patch_embed) failed: CUDA_ERROR_ILLEGAL_ADDRESS"),
        ({}, {"FAKE_CUDA_LOAD_ERR": "209"}, "cuModuleLoadData failed: CUDA_ERROR_NO_BINARY_FOR_GPU (209)"),
    ],
)
def test_embed_errors(harness, tmp_path, kw, env, message):
    res, log = run(harness, tmp_path, [embed(**kw)], **env)
    assert res[0].startswith("ERR ") and message in res[0], res
    assert not launches(log)


def test_embed_largest_int32_sizes_are_passed_through(harness, tmp_path):
    # rows B * L up to 2^31 - 256 (the last tile's row indices stay int32): 2^23 - 1 images of 256 patches
    B = 2**23 - 1
    res, log = run(harness, tmp_path, [embed(B=B, C=1, H=256, W=256, P=0, N=16)])
    assert res == ["OK"]
    (launch,) = launches(log)
    assert launch["image"] == "embed/kFloat32/sm90/kLarge/alignedtrue"
    assert launch["grid"] == f"{(B * 256 + 127) // 128},1,1"
    assert launch["args"].endswith(f",{B},1,256,256,16,256,0,16,256,16,0,0")


def test_embed_empty_launches_nothing(harness, tmp_path):
    # B = 0, N = 0, and no rows at all (P = 0 and an image smaller than one patch)
    res, log = run(harness, tmp_path, [embed(B=0), embed(N=0), embed(H=15, P=0), embed(B=0, C=0, H=0, W=0, P=0)])
    assert res == ["OK"] * 4 and not launches(log)


def merge(*, dtype=1, T=394, B=2, C=384, H=6, Dh=64, num_prefix=1, r=8, class_token=1, bias=1, size=1, skip=0,
          skip_bias=0, misalign=0):  # fmt: skip
    """misalign i > 0: the i-th buffer of x, qkv, qkv_bias, size, skip, skip_bias, x_out, size_out, cu_out, src,
    key_bias, score is 8 bytes off."""
    return (f"M {dtype} {T} {B} {C} {H} {Dh} {num_prefix} {r} {class_token} {bias} {size} {skip} {skip_bias} "
            f"{misalign}")  # fmt: skip


def test_merge_launch_parameters(harness, tmp_path):
    res, log = run(harness, tmp_path, [merge(), merge(T=394, B=2, bias=0, size=0, class_token=0, r=1000),
                                       merge(skip=1, skip_bias=1)])  # fmt: skip
    assert res == ["OK", "OK", "OK"]
    first, second, third = launches(log)
    # n = 197, p = 1: n_A = 98 -> width 128, Dh 64 -> d64; grid (B,), 32 * the image's num_warps threads
    assert first["name"] == "_ragged_merge" and first["image"] == "merge/kFloat16/sm90/w128/d64"
    assert first["grid"] == "2,1,1" and first["block"] == "256,1,1" and first["smem"] == "24576"
    assert first["stream"] == "5000"
    # X, QKV, Bias, Size, Skip, SkipBias, XOut, SizeOut, CuOut, Src, KeyBias, Score, n, C, H, Dh, num_prefix, r,
    # has_bias, has_size, has_skip, has_skip_bias, class_token, global/profile scratch; absent skip / skip_bias: x's
    # pointer (never read, flags 0)
    outs = "c00000,c80000,cc0000,d00000,d80000,e00000"
    assert first["args"] == f"a00000,a80000,b00000,b40000,a00000,a00000,{outs},197,384,6,64,1,8,1,1,0,0,1,0,0"
    # absent bias / size: qkv's and size_out's pointers (never read, flags 0); r above n passed as n (int32)
    assert second["args"] == f"a00000,a80000,a80000,c80000,a00000,a00000,{outs},197,384,6,64,1,197,0,0,0,0,0,0,0"
    assert third["args"] == f"a00000,a80000,b00000,b40000,b80000,bc0000,{outs},197,384,6,64,1,8,1,1,1,1,1,0,0"
    assert len([x for x in log if x.startswith("load")]) == 1  # one module per image and context


@pytest.mark.parametrize(
    ("kw", "image", "block"),
    [
        ({}, "w128/d64", "256,1,1"),
        ({"T": 257, "B": 1, "num_prefix": 1}, "w128/d64", "256,1,1"),
        ({"T": 260, "B": 1, "num_prefix": 1}, "w512/d64", "256,1,1"),
        ({"T": 258, "B": 1, "num_prefix": 0}, "w512/d64", "256,1,1"),
        ({"T": 1026, "B": 1}, "w512/d64", "256,1,1"),
        ({"T": 1028, "B": 1}, "w2048/d64", "512,1,1"),
        ({"T": 4097, "B": 1}, "w2048/d64", "512,1,1"),
        ({"Dh": 16}, "w128/d64", "256,1,1"),
        ({"Dh": 80}, "w128/d128", "256,1,1"),
        ({"Dh": 128}, "w128/d128", "256,1,1"),
    ],
)  # fmt: skip
def test_merge_cubin_choice_by_width_and_head_dim(harness, tmp_path, kw, image, block):
    # p = 1: n_A = 128 at n = 257, 129 at n = 260, 512 at n = 1026, 513 at n = 1028, 2048 at n = 4097 (p = 0: 129 at
    # n = 258): the smallest width >= n_A, then the smallest block_d >= Dh
    res, log = run(harness, tmp_path, [merge(**kw)])
    assert res == ["OK"]
    (launch,) = launches(log)
    assert launch["image"] == f"merge/kFloat16/sm90/{image}" and launch["block"] == block


@pytest.mark.parametrize(("arch", "image", "block"), [(90, "sm90", "256,1,1"), (80, "sm80", "128,1,1"),
                                                      (86, "sm80", "128,1,1"), (89, "sm80", "128,1,1")])  # fmt: skip
def test_merge_cubin_choice_by_compute_capability(harness, tmp_path, arch, image, block):
    res, log = run(harness, tmp_path, [merge()], FAKE_CUDA_ARCH=str(arch))
    assert res == ["OK"]
    (launch,) = launches(log)
    assert launch["image"] == f"merge/kFloat16/{image}/w128/d64" and launch["block"] == block


@pytest.mark.parametrize(
    ("kw", "env", "message"),
    [
        ({}, {"FAKE_CUDA_ARCH": "70"}, "no RaggedMerge cubin for sm_70 fp16 (n_A = 98, Dh = 64) in this library"),
        ({"T": 260, "B": 1}, {"FAKE_CUDA_ARCH": "80"}, "no RaggedMerge cubin for sm_80 fp16 (n_A = 129, Dh = 64)"),
        ({"dtype": 0}, {}, "_ragged_merge: cubin expects 24 parameters, launcher passes 25"),
        ({"dtype": 2}, {}, "element type bf16 has no CUDA merge kernel (float16 and float do)"),
        ({"B": 0}, {}, "sizes must be T >= 0, B >= 1, C >= 0, H >= 1, Dh >= 1, num_prefix >= 0, r >= 0, got T = 394"),
        ({"T": -1}, {}, "sizes must be"),
        ({"H": 0}, {}, "sizes must be"),
        ({"r": -1}, {}, "sizes must be"),
        ({"T": 395}, {}, "T = 395, B = 2, C = 384, H = 6, Dh = 64, num_prefix = 1: T is not a multiple of B"),
        ({"num_prefix": 198}, {}, "num_prefix exceeds the n = 197 rows per image"),
        ({"C": 392}, {}, "C and Dh must be multiples of 16 on the CUDA EP"),
        ({"Dh": 72}, {}, "C and Dh must be multiples of 16 on the CUDA EP"),
        ({"Dh": 144}, {}, "head dim Dh = 144 exceeds the widest compiled head-dim block of this library (128)"),
        ({"T": 4099, "B": 1}, {}, "n_A = 2049 rows of set A per image (n = 4099, num_prefix = 1) exceed the widest"),
        ({"H": 2**30}, {}, "exceed the int32 sizes of the kernel"),
        ({"T": 2**31, "B": 1}, {}, "exceed the int32 sizes of the kernel"),
        ({"misalign": 1}, {}, "device buffer 'x' is not 16-byte aligned"),
        ({"misalign": 3}, {}, "device buffer 'qkv_bias' is not 16-byte aligned"),
        ({"skip": 1, "skip_bias": 1, "misalign": 5}, {}, "device buffer 'skip' is not 16-byte aligned"),
        ({"skip": 1, "skip_bias": 1, "misalign": 6}, {}, "device buffer 'skip_bias' is not 16-byte aligned"),
        ({"misalign": 12}, {}, "device buffer 'score' is not 16-byte aligned"),
        ({"skip_bias": 1}, {}, "skip_bias is given without skip"),
        ({}, {"FAKE_CUDA_LAUNCH_ERR": "700"}, "cuLaunchKernel(_ragged_merge) failed: CUDA_ERROR_ILLEGAL_ADDRESS"),
        ({}, {"FAKE_CUDA_LOAD_ERR": "209"}, "cuModuleLoadData failed: CUDA_ERROR_NO_BINARY_FOR_GPU (209)"),
    ],
)
def test_merge_errors_launch_nothing(harness, tmp_path, kw, env, message):
    res, log = run(harness, tmp_path, [merge(**kw)], **env)
    assert res[0].startswith("ERR ") and message in res[0], res
    assert not launches(log)


def test_merge_empty_images_still_write_cu_out(harness, tmp_path):
    # T = 0 (n = 0): one launch of grid (B,), which writes cu_out = 0
    res, log = run(harness, tmp_path, [merge(T=0, B=3, num_prefix=0)])
    assert res == ["OK"]
    (launch,) = launches(log)
    assert launch["grid"] == "3,1,1" and launch["args"].endswith(",0,384,6,64,0,0,1,1,0,0,1,0,0")
