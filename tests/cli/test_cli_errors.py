"""The CLI's error contract: every bad input exits 2 with one "error:" line and no traceback,
SIGINT/SIGTERM exit 130, and no command leaves a file (or a hidden temp file) in its output folder.

Most cases fail before any export or inference: models with a raggedvit recipe but a trivial graph stand in for
real exports. The table of input errors runs in this process (click's runner: the same error mapping, no Python
start per case); the console entry point, the full disk, the NaN report and the signals run in subprocesses. The
interrupt cases run a real export and signal it while its output is being written.
"""

from __future__ import annotations

import os
import resource
import signal
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import pytest
from onnx import TensorProto, helper

from tests.support.cli import run_cli

ROOT = Path(__file__).resolve().parents[2]
MODEL = "deit_tiny_patch16_224"


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    path = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), **(extra or {})}
    env.pop("RAGGEDVIT_DEBUG", None)
    return env


def cli(*args: str, preexec_fn=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "raggedvit", *args],
        capture_output=True,
        text=True,
        env=_env({"PYTHONDONTWRITEBYTECODE": "1"}),
        cwd=ROOT,
        timeout=300,
        preexec_fn=preexec_fn,
    )


def assert_one_error(code: int, stderr: str, expected_code: int, fragment: str) -> None:
    lines = stderr.strip().splitlines()
    assert code == expected_code, stderr
    assert "Traceback" not in stderr, stderr
    assert [ln for ln in lines if ln.startswith("error: ")] == [lines[-1]], stderr
    assert fragment in lines[-1], stderr


# ---- inputs ---------------------------------------------------------------------------------------
def _fake_export(
    path: Path, *, unknown_op: bool = False, nan_logits: bool = False, recipe_text: str | None = None
) -> Path:
    """A model with a raggedvit recipe (img 16) whose graph maps images [B, 3, 16, 16] to logits [B, 3] and
    token counts [B, 3]; unknown_op adds a node no registered library implements; nan_logits makes the logits
    [B, 1000] NaN (as weights with a NaN give), with a recipe complete enough to validate (seeded, no pruning)."""
    from raggedvit.exporter.metadata import write_recipe

    nodes = [
        helper.make_node("ReduceMean", ["images"], ["logits"], axes=[2, 3], keepdims=0),
        helper.make_node("Abs", ["logits"], ["token_counts"]),
    ]
    init, classes = [], 3
    if nan_logits:  # 0 / 0 on every class
        zero = onnx.numpy_helper.from_array(np.zeros((3, 1000), np.float32), "zero")
        nodes[0:1] = [
            helper.make_node("ReduceMean", ["images"], ["mean"], axes=[2, 3], keepdims=0),
            helper.make_node("MatMul", ["mean", "zero"], ["z"]),
            helper.make_node("Div", ["z", "z"], ["logits"]),
        ]
        nodes[-1] = helper.make_node("Abs", ["mean"], ["token_counts"])
        init, classes = [zero], 1000
    opsets = [helper.make_opsetid("", 17)]
    if unknown_op:
        nodes[1] = helper.make_node("Missing", ["logits"], ["token_counts"], domain="com.example")
        opsets.append(helper.make_opsetid("com.example", 1))
    graph = helper.make_graph(
        nodes,
        "fake",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["B", 3, 16, 16])],
        [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", classes]),
            helper.make_tensor_value_info("token_counts", TensorProto.FLOAT, ["B", 3]),
        ],
        initializer=init,
    )
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    recipe = {"model": MODEL, "img_size": 16, "dtype": "fp32", "weights": {"source": "seeded", "seed": 0}}
    if nan_logits:
        prune = {"policy": "none", "prune_at": [], "keep": 0.5, "mass": 0.9, "fuse": False}
        recipe |= {"prune": prune, "num_prefix_tokens": 1}
    write_recipe(model, recipe)
    if recipe_text is not None:  # the recipe as given (not JSON)
        model.metadata_props[0].value = recipe_text
    onnx.save(model, path)
    return path


def _png(width: int, height: int, pixels: bytes | None = None) -> bytes:
    """An RGB PNG; without pixels only its header claims the size (a decompression bomb for PIL)."""

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    rows = (
        b"" if pixels is None else b"".join(b"\0" + pixels[r * width * 3 : (r + 1) * width * 3] for r in range(height))
    )
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    import torch

    d = tmp_path_factory.mktemp("inputs")
    files = {"fake": _fake_export(d / "fake.onnx"), "unknown_op": _fake_export(d / "op.onnx", unknown_op=True)}
    files["nan"] = _fake_export(d / "nan.onnx", nan_logits=True)
    files["badrecipe"] = _fake_export(d / "badrecipe.onnx", recipe_text="{'model': 'deit'}")
    (d / "empty.pth").write_bytes(b"")
    torch.save({"head.weight": torch.zeros(10, 192)}, d / "mismatch.pth")
    (d / "truncated.pth").write_bytes((d / "mismatch.pth").read_bytes()[:300])
    (d / "notonnx.onnx").write_bytes(b"definitely not a protobuf")
    noise = np.random.default_rng(0).integers(0, 256, 64 * 64 * 3, dtype=np.uint8).tobytes()
    images = {
        "img_undecodable": ("x.jpg", b"not an image at all"),
        "img_truncated": ("x.png", _png(64, 64, noise)[:2000]),
        "img_bomb": ("x.png", _png(20_000, 20_000)),
    }
    for name, (fname, data) in images.items():
        (d / name).mkdir()
        (d / name / "good.png").write_bytes(_png(64, 64, noise))
        (d / name / fname).write_bytes(data)
    files.update({p.stem if p.is_file() else p.name: p for p in d.iterdir()})
    return files


# ---- cases that fail before any export or inference ---------------------------------------------------
EXPORT = ["export", MODEL, "-o", "{out}/o.onnx"]
VALIDATE = ["validate", "{fake}", "--random", "1", "--report", "{out}/rep"]
BENCH = ["bench", "{fake}", "--batch", "1", "--seconds", "0.01", "--json", "{out}/b.json"]
CASES = {
    "no command": ([], "missing command; see 'raggedvit --help'"),
    "empty checkpoint": ([*EXPORT, "--checkpoint", "{empty}"], "is empty (0 bytes)"),
    "truncated checkpoint": ([*EXPORT, "--checkpoint", "{truncated}"], "cannot read checkpoint 'truncated.pth'"),
    "state-dict mismatch": ([*EXPORT, "--checkpoint", "{mismatch}"], "does not match deit_tiny_patch16_224: size mis"),
    "keep with cls-mass": ([*EXPORT, "--policy", "cls-mass", "--keep", "0.3"], "--keep does not apply to --policy cls"),
    "mass with topk-l2": ([*EXPORT, "--mass", "0.8"], "--mass does not apply to --policy topk-l2"),
    "mass with evit": ([*EXPORT, "--policy", "evit", "--mass", "0.8"], "--mass does not apply to --policy evit"),
    "prune-at with none": ([*EXPORT, "--policy", "none", "--prune-at", "4"], "--prune-at does not apply"),
    "keep with none": ([*EXPORT, "--policy", "none", "--keep", "0.5"], "--keep does not apply to --policy none"),
    "mass with none": ([*EXPORT, "--policy", "none", "--mass", "0.9"], "--mass does not apply to --policy none"),
    "fuse with none": ([*EXPORT, "--policy", "none", "--fuse"], "--fuse does not apply to --policy none"),
    "export to a fifo": (["export", MODEL, "-o", "{out}/fifo"], "exists and is not a regular file"),
    "atol nan": ([*VALIDATE, "--atol", "nan"], "--atol must be > 0 and finite, got nan"),
    "atol negative": ([*VALIDATE, "--atol", "-0.1"], "--atol must be > 0 and finite"),
    "atol inf": ([*VALIDATE, "--atol", "inf"], "--atol must be > 0 and finite"),
    "rtol nan": ([*VALIDATE, "--rtol", "nan"], "--rtol must be >= 0 and finite"),
    "rtol negative": ([*VALIDATE, "--rtol", "-1e-3"], "--rtol must be >= 0 and finite"),
    "min-top1 2": ([*VALIDATE, "--min-top1", "2"], "--min-top1 must be in [0, 1], got 2"),
    "min-top1 negative": ([*VALIDATE, "--min-top1", "-0.5"], "--min-top1 must be in [0, 1]"),
    "tie-eps nan": ([*VALIDATE, "--tie-eps", "nan"], "--tie-eps must be >= 0 and finite"),
    "undecodable image": (["validate", "{fake}", "--images", "{img_undecodable}"], "cannot decode image"),
    "truncated image": (["validate", "{fake}", "--images", "{img_truncated}"], "truncated"),
    "decompression bomb": (["validate", "{fake}", "--images", "{img_bomb}"], "decompression bomb"),
    "unregistered op": (["validate", "{unknown_op}", "--random", "1"], "ONNX Runtime cannot load op.onnx"),
    "bench non-ONNX": (["bench", "{notonnx}"], "notonnx.onnx is not a readable ONNX model"),
    "bench huge batch": ([*BENCH[:2], "--batch", "99999999999"], "--batch 99999999999 needs"),
    "bench seconds nan": ([*BENCH, "--seconds", "nan"], "--seconds must be > 0 and finite"),
    "bench json to a fifo": ([*BENCH[:-1], "{out}/fifo"], "exists and is not a regular file"),
    # paths: OS errors are one line naming the path and the problem
    "output is a symlink loop": (["export", MODEL, "--seed", "0", "-o", "{out}/a"], "'{out}/a': a symlink loop"),
    "symlink loop above the output": ([*EXPORT[:3], "{out}/a/m.onnx"], "'{out}/a/m.onnx': a symlink loop in its"),
    "checkpoint is a directory": ([*EXPORT, "--checkpoint", "{img_bomb}"], "is a directory, not a file"),
    "triton-repo DIR is a symlink loop": (["triton-repo", "{fake}", "{out}/a"], "DIR '{out}/a' is a symlink loop"),
    # an empty path (an unset shell variable) is refused, never the current folder
    "validate report empty": ([*VALIDATE[:4], "--report", ""], "--report '.' names no file: give REPORT"),
    "triton-repo DIR empty": (["triton-repo", "{fake}", ""], "DIR is empty (''): name the folder"),
    "export output empty": (["export", MODEL, "-o", ""], "output '.' is a directory"),
    "bench json empty": ([*BENCH[:-1], ""], "--json '.' is a directory"),
    "checkpoint is a symlink loop": ([*EXPORT, "--checkpoint", "{out}/a"], "'{out}/a' is a symlink loop"),
    # sizes the model cannot take, checked before tracing
    "img-size 7": ([*EXPORT, "--seed", "0", "--img-size", "7"], "--img-size 7 is too small for deit_tiny_patch16"),
    "img-size 8": ([*EXPORT, "--img-size", "8"], "the smallest valid size is 16 (its patch size)"),
    # memory needed up front
    "validate random too many": (["validate", "{fake}", "--random", "1000000000"], "--random 1000000000 needs"),
    # an option the export does not use
    "checkpoint for a seeded export": (
        [*VALIDATE[:4], "--checkpoint", "{mismatch}"],
        "--checkpoint does not apply: fake.onnx was exported with seeded weights",
    ),
    # a recipe that is not JSON: said so, with what to do
    "validate bad recipe JSON": (
        ["validate", "{badrecipe}", "--random", "1"],
        "badrecipe.onnx: its 'raggedvit.recipe' metadata is malformed (not JSON: Expecting "
        "property name enclosed in double quotes at line 1 column 2): the model was edited or "
        "not written by raggedvit export; export it again",
    ),
    "bench bad recipe JSON": (["bench", "{badrecipe}"], "its 'raggedvit.recipe' metadata is malformed"),
    # names past the file system's limit: refused before any work
    "export name too long": (
        [*EXPORT[:3], "{out}/" + "x" * 251 + ".onnx"],
        "its name is 256 bytes and this file system takes at most 255; choose a shorter name",
    ),
    "bench json name too long": ([*BENCH[:-1], "{out}/" + "b" * 256], "takes at most 255; choose a shorter name"),
    # lists parsed alike
    "prune-at empty item": ([*EXPORT, "--prune-at", "1,,2"], "--prune-at must be comma-separated block indices"),
    "prune-at not a number": ([*EXPORT, "--prune-at", "4,x"], "got '4,x'"),
    "bench batch empty item": ([*BENCH[:2], "--batch", "1,,2"], "--batch must be comma-separated positive integers"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_input_error_exits_2(inputs, tmp_path, case):
    args, fragment = CASES[case]
    out = tmp_path / "out"
    out.mkdir()
    if any("{out}/fifo" in a for a in args):
        os.mkfifo(out / "fifo")
    if any(a.startswith("{out}/a") for a in args):  # a -> b -> a
        os.symlink("b", out / "a")
        os.symlink("a", out / "b")
    before = sorted(p.name for p in out.iterdir())
    res = run_cli(*(a.format(out=out, **inputs) for a in args))  # in this process: the same error mapping
    assert_one_error(res.returncode, res.stderr, 2, fragment.format(out=out))
    assert sorted(p.name for p in out.iterdir()) == before


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_export_to_proc_fails_before_tracing():
    """/proc takes no new file, though os.access says yes to root: refused at once (it was after the 9 s export)."""
    res = run_cli("export", MODEL, "--seed", "0", "-o", "/proc/x")
    assert_one_error(res.returncode, res.stderr, 2, "cannot write output '/proc/x': directory '/proc'")
    assert "choose another folder" in res.stderr or "is not writable" in res.stderr, res.stderr


def test_long_legal_names_are_written(inputs, tmp_path):
    """bench --json with a 252-character name (the temp name used to add 10 and fail after the timing)."""
    name = "b" * 247 + ".json"
    res = run_cli("bench", str(inputs["fake"]), "--batch", "1", "--seconds", "0.01", "--json", str(tmp_path / name))
    assert res.returncode == 0, res.stderr
    assert [p.name for p in tmp_path.iterdir()] == [name]


def test_entry_point_maps_errors_alike(inputs, tmp_path):
    """The console entry point in a process of its own gives the in-process runner's exit status and line."""
    for case in ("no command", "atol nan", "img-size 8"):
        args, fragment = CASES[case]
        out = tmp_path / case.replace(" ", "_")
        out.mkdir()
        argv = [a.format(out=out, **inputs) for a in args]
        res = cli(*argv)
        assert_one_error(res.returncode, res.stderr, 2, fragment)
        assert run_cli(*argv).stderr.strip().splitlines()[-1] == res.stderr.strip().splitlines()[-1]


def test_bench_cuda_without_cuda(inputs, tmp_path):
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has a CUDA EP")
    res = cli("bench", str(inputs["fake"]), "--device", "cuda", "--json", str(tmp_path / "b.json"))
    assert_one_error(res.returncode, res.stderr, 2, "--device cuda: onnxruntime")
    assert list(tmp_path.iterdir()) == []


def _full_disk() -> None:
    """preexec_fn: files of this process cannot grow past 64 bytes (writes fail with EFBIG like a full disk)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))


def test_bench_json_on_a_full_disk_leaves_nothing(inputs, tmp_path):
    res = cli(*(a.format(out=tmp_path, **inputs) for a in BENCH), preexec_fn=_full_disk)
    assert_one_error(res.returncode, res.stderr, 2, "cannot write --json")
    assert list(tmp_path.iterdir()) == []  # neither b.json nor a temp file


def test_validate_nan_logits_prints_only_its_verdict(inputs):
    """NaN logits (as weights with a NaN give): exit 1 with the report, and no numpy RuntimeWarning before it."""
    res = cli("validate", str(inputs["nan"]), "--random", "2")
    assert res.returncode == 1, res.stderr
    assert "Warning" not in res.stderr and "Warning" not in res.stdout, res.stderr
    assert "raggedvit validation: FAIL" in res.stdout


# ---- interrupts ---------------------------------------------------------------------------------------
# os.replace of the .onnx (the commit of atomic_write) first drops a marker, then waits: the signal arrives
# while the export's output exists only as a hidden temp file.
_SLOW_COMMIT = """
import os, sys, time
from pathlib import Path
_replace = os.replace
def _slow_replace(src, dst, *a, **k):
    if str(dst).endswith(".onnx"):
        Path(os.environ["MARKER"]).write_text(str(src))
        time.sleep(120)
    return _replace(src, dst, *a, **k)
os.replace = _slow_replace
sys.argv[0] = "raggedvit"
from raggedvit.cli import main
main()
"""


@pytest.fixture(scope="module")
def nan_checkpoint(tmp_path_factory) -> Path:
    import timm
    import torch

    model = timm.create_model(MODEL)
    state = model.state_dict()
    state["blocks.0.mlp.fc1.weight"][0, 0] = float("nan")
    path = tmp_path_factory.mktemp("nan") / "nan.pth"
    torch.save(state, path)
    return path


# click.echo of the "wrote ..." line first drops a marker, then waits: the signal arrives after the export's output
# was renamed into place, before the command ends.
_SLOW_END = """
import os, sys, time
from pathlib import Path
import click
_echo = click.echo
def _slow_echo(message=None, *a, **k):
    if str(message).startswith("wrote "):
        Path(os.environ["MARKER"]).write_text(str(message))
        time.sleep(120)
    return _echo(message, *a, **k)
click.echo = _slow_echo
sys.argv[0] = "raggedvit"
from raggedvit.cli import main
main()
"""


def test_interrupt_after_the_rename_exits_130_and_leaves_nothing(nan_checkpoint, tmp_path):
    """SIGTERM once m.onnx is complete in its folder but the command still runs: exit 130 with nothing left (the
    group's undo_on_interrupt), not 130 beside a complete file."""
    out, marker = tmp_path / "out", tmp_path / "marker"
    out.mkdir()
    args = ["export", MODEL, "--checkpoint", str(nan_checkpoint), "-o", str(out / "m.onnx")]
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_END, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env({"MARKER": str(marker)}), cwd=ROOT)  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), "the export never reached its last line"
        assert [p.name for p in out.iterdir()] == ["m.onnx"]  # complete, in place
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert_one_error(proc.returncode, stderr, 130, "interrupted by SIGTERM; nothing it wrote is left")
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_during_export_write_exits_130(nan_checkpoint, tmp_path, sig):
    """The export (of weights with a NaN: one warning line first) is signalled during its write: exit 130,
    one error line, no output and no temp file."""
    out, marker = tmp_path / "out", tmp_path / "marker"
    out.mkdir()
    args = ["export", MODEL, "--checkpoint", str(nan_checkpoint), "-o", str(out / "m.onnx")]
    proc = subprocess.Popen(
        [sys.executable, "-c", _SLOW_COMMIT, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env({"MARKER": str(marker)}),
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 240
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), "the export never reached its write"
        entries, src = list(out.iterdir()), Path(marker.read_text())
        # the output exists only as a hidden temp entry (the staged file, or the folder it is staged in)
        assert len(entries) == 1 and entries[0].name.startswith(".") and entries[0] in (src, *src.parents), entries
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert_one_error(proc.returncode, stderr, 130, f"interrupted by {sig.name}")
    warnings = [ln for ln in stderr.splitlines() if ln.startswith("warning: ")]
    assert len(warnings) == 1 and "NaN or Inf values in blocks.0.mlp.fc1.weight:" in warnings[0], stderr
    assert list(out.iterdir()) == []


def test_every_library_input_error_maps_once_to_exit_2() -> None:
    from raggedvit import InputError
    from raggedvit.cli.contract import exit_status
    from raggedvit.sweep import SweepInputError
    from raggedvit.validators.errors import ValidationInputError

    assert issubclass(SweepInputError, InputError) and issubclass(ValidationInputError, InputError)
    for err in (InputError("bad  input\nhere"), SweepInputError("bad grid"), ValidationInputError("bad model")):
        assert exit_status(err) == (2, " ".join(str(err).split()))
