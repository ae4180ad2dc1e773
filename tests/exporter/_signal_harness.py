"""Kills writers of raggedvit's atomic outputs the moment their temp entry appears (run as a script by
tests/exporter/test_io_signals.py).

    python3 tests/exporter/_signal_harness.py TARGET ATTEMPTS ROOT

For each attempt it forks a child that, like the CLI, turns SIGINT / SIGTERM into Interrupted and writes TARGET
into the empty folder ROOT/<attempt> through the library call the command uses (export: save_model; triton-repo:
write_model_repository; validate --report: ValidationReport.write; bench --json: atomic_write), ending with the
CLI's exit code (raggedvit._cli_support.exit_status). The parent watches the folder with inotify and sends SIGTERM
as soon as the first entry is created there (attempt i waits (i % 4) * 100 us more, so the signal lands at several
moments of the write), then prints one JSON line: the exit code, whether it was killed and the folder's listing.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

IN_CREATE, IN_MOVED_TO, IN_NONBLOCK = 0x100, 0x80, 0o4000


def _tiny_onnx() -> bytes:
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 4])
    graph = helper.make_graph([helper.make_node("Relu", ["images"], ["logits"])], "tiny", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model.SerializeToString()


def _targets(scratch: Path):
    """{name: (write(folder), the complete listing)}: each writes one output set into `folder`."""
    scratch.mkdir(parents=True, exist_ok=True)

    def export(folder: Path) -> None:
        import onnx_ir as ir

        from raggedvit.exporter.export import save_model

        save_model(ir.from_proto(__import__("onnx").load_from_string(_tiny_onnx())), folder / "m.onnx")

    def triton_repo(folder: Path) -> None:
        from raggedvit.triton_repo import write_model_repository

        model, lib = scratch / "m.onnx", scratch / "libstub.so"
        if not model.exists():
            model.write_bytes(_tiny_onnx())
            lib.write_bytes(b"\0" * 4096)
        write_model_repository(model, folder, name="m", kind="cpu", library=lib)

    def report(folder: Path) -> None:
        from raggedvit.validators import ImageRow, Thresholds, ValidationReport

        rows = [ImageRow(i, f"img{i}", 1e-6, 5e-7, 3, 3, [99], [99], False) for i in range(50)]
        ValidationReport("m.onnx", {"model": "deit"}, "cpu", ["CPUExecutionProvider"], Thresholds(),
                         rows=rows).write(folder / "rep.json")  # fmt: skip

    def bench_json(folder: Path) -> None:
        from raggedvit.exporter._io import atomic_write

        atomic_write(folder / "b.json", json.dumps({"results": [{"batch": b} for b in range(1000)]}))

    return {
        "export": (export, ["m.onnx"]),
        "triton-repo": (triton_repo, ["m"]),
        "report": (report, ["rep.json", "rep.md"]),
        "bench-json": (bench_json, ["b.json"]),
    }


def _child(write, folder: Path) -> int:
    from raggedvit._cli_support import exit_status, interrupts_raise

    interrupts_raise()
    try:
        write(folder)
        return 0
    except BaseException as e:  # noqa: BLE001 - the CLI's one error contract
        return exit_status(e)[0]


def main(target: str, attempts: int, root: Path) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    write, _ = _targets(root / "scratch")[target]
    write(root / "scratch")  # warm up: imports and first-call costs happen before any fork
    for name in os.listdir(root / "scratch"):
        if name not in ("m.onnx", "libstub.so"):
            p = root / "scratch" / name
            __import__("shutil").rmtree(p) if p.is_dir() else p.unlink()
    for i in range(attempts):
        folder = root / str(i)
        folder.mkdir()
        fd = libc.inotify_init1(IN_NONBLOCK)
        if fd < 0 or libc.inotify_add_watch(fd, str(folder).encode(), IN_CREATE | IN_MOVED_TO) < 0:
            raise OSError(ctypes.get_errno(), "inotify")
        pid = os.fork()
        if pid == 0:
            os.close(fd)
            os._exit(_child(write, folder))
        killed = False
        ready, _, _ = select.select([fd], [], [], 30.0)
        if ready:
            wait = (i % 4) * 100e-6
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < wait:
                pass
            try:
                os.kill(pid, signal.SIGTERM)
                killed = True
            except ProcessLookupError:
                pass
        _, status = os.waitpid(pid, 0)
        os.close(fd)
        listing = []
        for dirpath, dirnames, filenames in os.walk(folder):
            rel = os.path.relpath(dirpath, folder)
            listing += [os.path.normpath(os.path.join(rel, n)) for n in dirnames + filenames]
        print(json.dumps({"attempt": i, "code": os.waitstatus_to_exitcode(status), "killed": killed,
                          "listing": sorted(listing)}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]))
