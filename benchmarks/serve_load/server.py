"""A `raggedvit serve` process on a free loopback port, and every process it starts (the local Ray instance).

    with ServerProcess("deit_tiny.onnx", "--replicas", "2") as server:
        server.wait_ready(timeout_s=240)
        ...                                   # server.url, server.replica_pids()
        rc = server.stop(signal.SIGTERM)      # the command's exit code (None: still running after the timeout)
    # leaving the block kills whatever of its process tree is still running, however the block ended

The tree is remembered as it is seen (a process re-parented after its parent died stays known); psutil keeps each
process's start time, so a reused PID is never signalled.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

__all__ = ["ServerProcess", "free_port"]

ROOT = Path(__file__).resolve().parents[2]
REPLICA = "ServeReplica:"  # Ray's process title of a Serve replica


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class ServerProcess:
    """`python3 -m raggedvit serve MODEL --port P ARGS...` in its own session (a signal to it reaches it alone),
    its output in log files; PYTHONPATH starts with this checkout, so Ray's workers import the same raggedvit."""

    def __init__(self, onnx_path: str | Path, *args: str, port: int | None = None, env: dict | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._logs = tempfile.TemporaryDirectory(prefix="raggedvit-serve-")
        self.stdout_path = Path(self._logs.name) / "stdout"
        self.stderr_path = Path(self._logs.name) / "stderr"
        environ = {**os.environ, **(env or {})}
        environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [environ.get("PYTHONPATH")])])
        environ.pop("RAGGEDVIT_DEBUG", None)
        cmd = [sys.executable, "-m", "raggedvit", "serve", str(onnx_path), "--port", str(self.port), *args]
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=environ, cwd=ROOT, start_new_session=True
            )
        self._tree: dict[int, psutil.Process] = {}
        self.update()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.kill()
        self._logs.cleanup()

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def update(self) -> None:
        """Remember the command's process and its descendants as they are now."""
        try:
            root = psutil.Process(self.proc.pid)
            self._tree.setdefault(root.pid, root)
            for p in root.children(recursive=True):
                self._tree.setdefault(p.pid, p)
        except psutil.Error:  # the command has exited (or a child exited while listed)
            pass

    def running(self) -> list[psutil.Process]:
        """The processes of the tree still running (zombies are not)."""
        self.update()
        return [p for p in self._tree.values() if _running(p)]

    def replica_pids(self) -> list[int]:
        """PIDs of the running Serve replicas."""
        out = []
        for p in self.running():
            try:
                if any(REPLICA in part for part in p.cmdline()):
                    out.append(p.pid)
            except psutil.Error:
                pass
        return sorted(out)

    def health(self, timeout_s: float = 5.0) -> dict | None:
        """GET /health's JSON, None when it does not answer 200."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=timeout_s) as r:
                return json.loads(r.read()) if r.status == 200 else None
        except (OSError, urllib.error.URLError, ValueError):
            return None

    def wait_ready(self, timeout_s: float = 240.0) -> dict:
        """Waits for /health; RuntimeError with the command's stderr when it exits first or is not ready in time."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.update()
            if self.proc.poll() is not None:
                raise RuntimeError(f"raggedvit serve exited {self.proc.returncode}: {self.stderr[-3000:]}")
            answer = self.health()
            if answer is not None:
                return answer
            time.sleep(0.5)
        raise RuntimeError(f"raggedvit serve not ready after {timeout_s:.0f} s: {self.stderr[-3000:]}")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 90.0) -> int | None:
        """Sends `sig` to the command alone and waits for it to exit: its exit code, None if still running."""
        self.update()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def kill(self, timeout_s: float = 10.0) -> None:
        """SIGKILL to every process of the tree still running, and to the command's process group while a process of
        the tree is still in it (so the group's ID cannot have been taken by anyone else)."""
        procs = self.running()
        group = self.proc.pid  # start_new_session: the command leads its group
        ours = False
        for p in procs:
            try:
                ours = ours or os.getpgid(p.pid) == group
                p.kill()
            except (psutil.Error, OSError):
                pass
        if ours:
            try:
                os.killpg(group, signal.SIGKILL)
            except OSError:  # the group emptied meanwhile
                pass
        psutil.wait_procs(procs, timeout=timeout_s)
        if self.proc.poll() is None:
            self.proc.wait(timeout_s)
