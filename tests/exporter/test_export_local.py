"""Exports carry nothing of the exporting machine: no absolute path, user or host name in any metadata value (model,
graph, node, value), doc_string or producer field, under every policy and dtype; and the same seeded export is
byte-identical from two working directories and two install locations (save_model's strip_local_metadata)."""

from __future__ import annotations

import getpass
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from raggedvit.exporter import export_onnx
from raggedvit.pruning import PruneSpec
from raggedvit.weights import load_vit

ROOT = Path(__file__).resolve().parents[2]
POLICIES = {"none": "none", "topk-l2": "topk-l2", "evit": "evit", "cls-mass": "cls-mass"}
DTYPES = ("fp32", "fp16", "fp16-all")
_PATH = re.compile(r"(?<![\w.:-])(/[\w.+@-]+)(?:/[\w.+@-]*)*")


@pytest.fixture(scope="module")
def deit_tiny_d2():
    vit, _ = load_vit("deit_tiny_patch16_224", seed=0, model_kwargs={"depth": 2})
    return vit


def _texts(m: onnx.ModelProto) -> list[str]:
    """Every free-text field of the file: model / graph / node / value / function metadata, doc strings, producer."""
    out = [m.doc_string, m.producer_name, m.producer_version, m.domain]
    graphs = [m.graph]
    out += [p.key + "=" + p.value for p in m.metadata_props]
    for f in m.functions:
        out += [f.doc_string] + [p.key + "=" + p.value for p in f.metadata_props]
        graphs.append(f)
    for g in graphs:
        if isinstance(g, onnx.GraphProto):
            out += [g.doc_string] + [p.key + "=" + p.value for p in g.metadata_props]
            for v in (*g.input, *g.output, *g.value_info):
                out += [v.doc_string] + [p.key + "=" + p.value for p in v.metadata_props]
            for t in g.initializer:
                out += [t.doc_string] + [p.key + "=" + p.value for p in t.metadata_props]
        for n in g.node:
            out += [n.doc_string] + [p.key + "=" + p.value for p in n.metadata_props]
    return [t for t in out if t]


def local_traces(m: onnx.ModelProto, extra: tuple[str, ...] = ()) -> list[str]:
    """The texts naming an existing absolute path (its first folder exists here: /path/to/... placeholders pass),
    a local folder (cwd, home, the checkout, sys.prefix), the user or the host."""
    words = [w for w in (getpass.getuser(), socket.gethostname()) if w]
    folders = [str(Path.cwd()), str(Path.home()), str(ROOT), sys.prefix, *extra]
    bad = []
    for text in _texts(m):
        if any(os.path.isdir(p) for p in _PATH.findall(text)):
            bad.append(text[:300])
        elif any(f in text for f in folders) or any(re.search(rf"\b{re.escape(w)}\b", text) for w in words):
            bad.append(text[:300])
    return bad


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_no_local_path_user_or_host_in_any_field(deit_tiny_d2, tmp_path, policy, dtype):
    spec = PruneSpec.from_strings(policy, "1" if policy != "none" else (), 0.5, 0.9)
    path = export_onnx(deit_tiny_d2, spec, tmp_path / "m.onnx", dtype=dtype, recipe={"model": "deit_tiny"})
    m = onnx.load(str(path))
    assert not local_traces(m, (str(tmp_path),)), local_traces(m, (str(tmp_path),))
    keys = {p.key for n in m.graph.node for p in n.metadata_props}
    assert not [k for k in keys if k.startswith("pkg.torch.") or k == "namespace"], keys


_EXPORT = (
    "import sys; from raggedvit.weights import load_vit; from raggedvit.pruning import PruneSpec; "
    "from raggedvit.exporter import export_onnx; "
    "vit, _ = load_vit('deit_tiny_patch16_224', seed=0, model_kwargs={'depth': 2}); "
    "export_onnx(vit, PruneSpec.from_strings('topk-l2', '1'), sys.argv[1], recipe={'model': 'deit_tiny'})"
)


def test_same_export_is_byte_identical_across_directories_and_installs(deit_tiny_d2, tmp_path, monkeypatch):
    """One export here from the checkout in folder a/, one by a copy of the package installed elsewhere, run from
    folder b/ (a child process)."""
    install = tmp_path / "site" / "elsewhere"
    shutil.copytree(ROOT / "raggedvit", install / "raggedvit", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    for cwd in ("a", "b"):
        (tmp_path / cwd).mkdir()
    monkeypatch.chdir(tmp_path / "a")
    export_onnx(deit_tiny_d2, PruneSpec.from_strings("topk-l2", "1"), "m.onnx", recipe={"model": "deit_tiny"})
    env = {**os.environ, "PYTHONPATH": str(install)}
    done = subprocess.run([sys.executable, "-c", _EXPORT, "m.onnx"], cwd=tmp_path / "b", env=env,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    here, there = ((tmp_path / cwd / "m.onnx").read_bytes() for cwd in ("a", "b"))
    assert here == there
    assert not local_traces(onnx.load_from_string(there), (str(tmp_path),))
