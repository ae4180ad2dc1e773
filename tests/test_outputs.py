"""atomic_write: whole file or nothing, with the permissions of a plain open()."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from raggedvit.outputs import atomic_write, atomic_write_all, staging_dir


def test_atomic_write_content_and_mode(tmp_path):
    old = os.umask(0o022)
    try:
        path = atomic_write(tmp_path / "r.json", "{}\n")
    finally:
        os.umask(old)
    assert path.read_text() == "{}\n"
    assert path.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_atomic_write_leaves_nothing_on_failure(tmp_path):
    with pytest.raises(TypeError):
        atomic_write(tmp_path / "x.bin", object())  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_atomic_write_all_is_all_or_nothing(tmp_path):
    """The second rename fails (its target is a non-empty folder): the first file is not left either."""
    (tmp_path / "rep.md").mkdir()
    (tmp_path / "rep.md" / "x").write_text("")
    with pytest.raises(OSError):
        atomic_write_all({tmp_path / "rep.json": "{}", tmp_path / "rep.md": "# r"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep.md"]
    assert atomic_write_all({tmp_path / "a.json": "1", tmp_path / "a.md": "2"})
    assert (tmp_path / "a.json").read_text() == "1" and (tmp_path / "a.md").read_text() == "2"


def test_staging_dir_is_removed_on_any_exit(tmp_path):
    with pytest.raises(KeyboardInterrupt), staging_dir(tmp_path, "m.onnx") as tmp:
        (tmp / "part").write_bytes(b"x")
        assert tmp.parent == tmp_path and tmp.name.startswith(".m.onnx.")
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


# ---- two writers of one output pair (an export whose weights go to a .data file) --------------------------------
def _weights_model(value: float):
    """An onnx_ir model whose one 4 KiB initializer holds `value` everywhere and whose doc_string names it."""
    import numpy as np
    import onnx_ir as ir
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.full((32, 32), value, np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x], [y], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], doc_string=str(value))
    model.ir_version = 10
    return ir.from_proto(model)


@pytest.mark.parametrize("locked", [True, False], ids=["locked", "unlocked (the check sees the mix)"])
def test_two_exports_to_one_path_leave_one_consistent_pair(tmp_path, monkeypatch, locked):
    """Writer A renames its .data, then stalls (until B has renamed its .onnx, at most 1 s) before its .onnx; writer B
    commits its pair meanwhile. Under the folder lock B waits, and the pair left is B's; without it A's .onnx ends up
    beside B's .data."""
    import contextlib
    import threading

    import numpy as np
    import onnx

    from raggedvit.exporter import saving
    from raggedvit.outputs import writes

    monkeypatch.setattr(saving, "EXTERNAL_DATA_BYTES", 1024)
    if not locked:
        monkeypatch.setattr(writes, "_folder_lock", lambda folder: contextlib.nullcontext())
    a_renamed_data, b_renamed_onnx = threading.Event(), threading.Event()
    real_replace = os.replace

    def slowed(src, dst):  # the staging step slowed down: A stalls between the two renames into place
        real_replace(src, dst)
        if Path(dst).parent != tmp_path:  # onnx_ir's own rename inside the staging folder
            return
        if threading.current_thread().name == "A" and str(dst).endswith(".data"):
            a_renamed_data.set()
            b_renamed_onnx.wait(1.0)
        if threading.current_thread().name == "B" and str(dst).endswith(".onnx"):
            b_renamed_onnx.set()

    monkeypatch.setattr(os, "replace", slowed)
    path = tmp_path / "m.onnx"
    a = threading.Thread(target=saving.save_model, args=(_weights_model(1.0), path), name="A")
    b = threading.Thread(target=saving.save_model, args=(_weights_model(2.0), path), name="B")
    a.start()
    assert a_renamed_data.wait(10)
    b.start()
    a.join()
    b.join()
    model = onnx.load(str(path))  # with its external data
    weights = onnx.numpy_helper.to_array(model.graph.initializer[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"]
    consistent = bool((weights == float(model.doc_string)).all())
    assert consistent == locked, (model.doc_string, np.unique(weights))


# ---- names up to the file system's limit ----------------------------------------------------------------------------
def test_names_up_to_the_limit_are_written(tmp_path, monkeypatch):
    """A 255-byte target name gets a staging folder (its NAME part shortened); an export's data file of a long name is
    shortened with a hash of the name; check_target refuses a name past the limit before any work."""
    import errno

    import onnx

    from raggedvit.exporter import saving
    from raggedvit.exporter.files import external_data_name, model_files
    from raggedvit.outputs import check_target, name_max

    limit = name_max(tmp_path)
    assert atomic_write(tmp_path / ("j" * (limit - 5) + ".json"), "{}").read_text() == "{}"
    monkeypatch.setattr(saving, "EXTERNAL_DATA_BYTES", 1024)
    long_a, long_b = tmp_path / ("m" * (limit - 6) + "a.onnx"), tmp_path / ("m" * (limit - 6) + "b.onnx")
    for path in (long_a, long_b):
        saving.save_model(_weights_model(3.0), path)
    data_a, data_b = external_data_name(long_a), external_data_name(long_b)
    assert len(data_a) == limit - 10 and data_a.endswith(".data") and data_a != data_b
    assert [p.name for p in model_files(long_a)] == [long_a.name, data_a]
    assert onnx.numpy_helper.to_array(onnx.load(str(long_b)).graph.initializer[0]).min() == 3.0  # with its data
    assert external_data_name(tmp_path / "m.onnx") == "m.onnx.data"
    with pytest.raises(OSError) as info:
        check_target(tmp_path / ("x" * (limit + 1)))
    assert info.value.errno == errno.ENAMETOOLONG and "the limit here is" in info.value.strerror
    assert len(list(tmp_path.iterdir())) == 5  # nothing hidden left


def test_check_target_tries_the_folder(tmp_path):
    """os.access says yes to root in /proc; check_target creates (and removes) the staging folder to know."""
    import errno

    from raggedvit.outputs import check_target

    check_target(tmp_path / "m.onnx")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(OSError) as info:
        check_target(tmp_path / "missing" / "m.onnx")
    assert info.value.errno == errno.ENOENT and info.value.filename == str(tmp_path / "missing" / "m.onnx")
    if os.path.isdir("/proc/self"):
        with pytest.raises(OSError) as info:
            check_target("/proc/x")
        assert info.value.filename == "/proc/x"


def test_undo_on_interrupt_removes_what_the_block_committed(tmp_path):
    from raggedvit.outputs import undo_on_interrupt

    with undo_on_interrupt():
        atomic_write(tmp_path / "kept.json", "1")
    with pytest.raises(KeyboardInterrupt), undo_on_interrupt():
        atomic_write_all({tmp_path / "r.json": "1", tmp_path / "r.md": "2"})
        raise KeyboardInterrupt  # after the renames: the command is interrupted, its outputs go
    assert [p.name for p in tmp_path.iterdir()] == ["kept.json"]
    with pytest.raises(KeyboardInterrupt) as info, undo_on_interrupt():  # progress a later run resumes from stays
        atomic_write_all({tmp_path / "sweep.json": "1"}, resumable=True)
        atomic_write(tmp_path / "other.json", "2")
        raise KeyboardInterrupt
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.json", "sweep.json"]
    assert info.value.kept == [tmp_path / "sweep.json"]


@pytest.mark.parametrize("finalizer", ["__del__", "weakref callback"])
def test_a_signal_lost_in_a_finalizer_is_raised_at_the_next_line(capfd, finalizer) -> None:
    """Python drops an exception raised while a __del__ method or a weakref callback (torch's WeakKeyDictionary) runs,
    and prints "Exception ignored in ... Traceback"; the handler has already ignored further signals. The hook prints
    nothing and raises it at the next line of the code the finalizer interrupted; raise_pending_interrupt (called
    between a loop's steps) raises it again too."""
    import signal
    import weakref

    from raggedvit.outputs import Interrupted, interrupts_raise, raise_pending_interrupt

    def signalled(*_) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # the handler runs here, inside the finalizer
        for _ in range(1000):  # a few bytecodes for the handler to run in
            pass

    class Finalized:
        __del__ = signalled

    class Plain:
        pass

    restore = interrupts_raise()
    lines: list[str] = []
    try:
        raise_pending_interrupt()  # nothing pending
        with pytest.raises(Interrupted) as info:
            obj = Finalized() if finalizer == "__del__" else Plain()
            ref = weakref.ref(obj, signalled)
            del obj  # the finalizer runs; Python drops the exception raised in it
            lines.append("the line after")
        assert lines == [] and info.value.signal_name == "SIGINT" and ref() is None
        with pytest.raises(Interrupted):
            raise_pending_interrupt()
    finally:
        restore()
    assert "Exception ignored" not in capfd.readouterr().err
    restore = interrupts_raise()  # a new command starts with nothing pending
    restore()
    raise_pending_interrupt()


def test_held_folder_locks_out_other_writers_and_leaves_no_empty_folder(tmp_path):
    """The holder's own commits go through; another process's commit waits for the block's end; a second holder is
    refused after wait_s. Folders the block made are removed if it wrote nothing, kept with what it wrote."""
    import subprocess
    import sys
    import time

    from raggedvit.outputs import held_folder
    from tests.support.env import ROOT, child_env

    out = tmp_path / "a" / "out"
    with held_folder(out) as folder:
        assert folder == out and out.is_dir()
        with pytest.raises(BlockingIOError) as info, held_folder(out, wait_s=0.2):
            pass
        assert info.value.filename == str(out)
    assert list(tmp_path.iterdir()) == []  # nothing written: a/ and a/out/ go

    write = f"from raggedvit.outputs import atomic_write; atomic_write({str(out / 'b.json')!r}, 'b')"
    with held_folder(out):
        atomic_write(out / "a.json", "a")  # no wait on its own lock
        other = subprocess.Popen([sys.executable, "-c", write], env=child_env(), cwd=ROOT)
        time.sleep(1.5)
        assert other.poll() is None and not (out / "b.json").exists()  # waiting for the folder
    assert other.wait(timeout=60) == 0 and sorted(p.name for p in out.iterdir()) == ["a.json", "b.json"]
    with held_folder(out):  # there before: stays whatever the block does
        pass
    assert out.is_dir()
