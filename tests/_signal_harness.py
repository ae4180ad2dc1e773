"""Kills writers of raggedvit's atomic outputs the moment their temp entry appears, or the moment an output is
renamed into place (run as a script by tests/test_outputs_signals.py).

    python3 tests/_signal_harness.py TARGET ATTEMPTS ROOT [temp|rename]

For each attempt it forks a child that, like the CLI, turns SIGINT / SIGTERM into Interrupted and, inside
undo_on_interrupt (the CLI's), writes TARGET into the empty folder ROOT/<attempt> through the library call the
command uses (export: save_model; triton-repo: write_model_repository; validate --report: ValidationReport.write;
bench --json: atomic_write), then goes on for AFTER_WRITE_S (the rest of a command: its last lines of output),
ending with the CLI's exit code (raggedvit.cli.contract.exit_status). The parent watches the folder with inotify
and sends SIGTERM as soon as the first entry is created there ("temp") or the first output is renamed into it
("rename"); attempt i waits (i % 4) * 100 us more, so the signal lands at several moments of the write. It prints
one JSON line per attempt: the exit code, whether it was killed and the folder's listing.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

IN_CREATE, IN_MOVED_TO, IN_NONBLOCK = 0x100, 0x80, 0o4000
_EVENT = "iIII"  # struct inotify_event: wd, mask, cookie, len (then len bytes of name)
AFTER_WRITE_S = 0.5  # long enough for the parent to see the rename and signal on a loaded machine


def _tiny_onnx() -> bytes:
    """images -> com.raggedvit::BiasGelu -> logits (triton-repo takes models with a raggedvit op only)."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 4])
    node = helper.make_node("BiasGelu", ["images"], ["logits"], domain="com.raggedvit")
    graph = helper.make_graph([node], "tiny", [x], [y])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.raggedvit", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    return model.SerializeToString()


def _targets(scratch: Path):
    """{name: (write(folder), the complete listing)}: each writes one output set into `folder`."""
    scratch.mkdir(parents=True, exist_ok=True)

    def export(folder: Path) -> None:
        import onnx_ir as ir

        from raggedvit.exporter.saving import save_model

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
        from raggedvit.outputs import atomic_write

        atomic_write(folder / "b.json", json.dumps({"results": [{"batch": b} for b in range(1000)]}))

    return {
        "export": (export, ["m.onnx"]),
        "triton-repo": (triton_repo, ["m"]),
        "report": (report, ["rep.json", "rep.md"]),
        "bench-json": (bench_json, ["b.json"]),
    }


def _child(write, folder: Path) -> int:
    from raggedvit.cli.contract import exit_status, interrupts_raise
    from raggedvit.outputs import undo_on_interrupt

    interrupts_raise()
    guard = undo_on_interrupt()
    try:
        with guard:
            write(folder)
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < AFTER_WRITE_S:  # the command is not over when its output is in place
                pass
        return 0
    except BaseException as e:  # noqa: BLE001 - the CLI's one error contract
        guard.undo(e)  # again, as the CLI's group does
        code = exit_status(e)[0]
        if code not in (0, 130):
            __import__("traceback").print_exception(e)  # on the harness's stderr, which the test reports
        return code


def _wait_for(fd: int, at: str) -> bool:
    """Blocks until the folder's first entry is created ("temp") or an entry not starting with "." is renamed into
    it ("rename"); False after 30 s without."""
    import struct

    deadline = time.monotonic() + 30.0
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return False
        if at == "temp":
            return True
        buf = os.read(fd, 65536)
        while buf:
            _, mask, _, size = struct.unpack_from(_EVENT, buf)
            head = struct.calcsize(_EVENT)
            name = buf[head : head + size].rstrip(b"\0").decode()
            buf = buf[head + size :]
            if mask & IN_MOVED_TO and not name.startswith("."):
                return True
    return False


def main(target: str, attempts: int, root: Path, at: str = "temp") -> None:
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
        if _wait_for(fd, at):
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
    main(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), *sys.argv[4:5])
