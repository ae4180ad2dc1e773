"""The package's layout as users and contributors meet it: every import path the README names resolves,
`python -m raggedvit` is the command line, the package root stays small and holds no import circle."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
MAX_ROOT_MODULES = 10  # raggedvit/*.py, __init__ and __main__ included: new code goes into a subpackage


def readme_paths() -> list[str]:
    """Every `raggedvit...` import path the README names: `from M import a, b` (M.a, M.b), `import M`, and every
    dotted name in text and code (`raggedvit.timing.measure`, `raggedvit.custom_ops.library_path()`)."""
    paths = []
    for module, names in re.findall(r"from (raggedvit[\w.]*) import ([\w, ]+)", README):
        paths += [f"{module}.{n.strip()}" for n in names.split(",") if n.strip()]
    paths += re.findall(r"\bimport (raggedvit[\w.]*)", README)
    paths += re.findall(r"(?<![\w/.-])(raggedvit(?:\.\w+)+)", README)
    return sorted(set(paths))


def resolve(path: str) -> object:
    """The object a dotted path names: the longest importable module prefix, then attributes."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        try:
            obj = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:  # a module that exists but fails to import is a failure, not a shorter prefix
                raise
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(path)


def test_readme_names_import_paths() -> None:
    paths = readme_paths()
    for path in ("raggedvit.pruning.PrunedViT", "raggedvit.timing.measure", "raggedvit.custom_ops.library_path"):
        assert path in paths


@pytest.mark.parametrize("path", readme_paths())
def test_readme_import_path_resolves(path: str) -> None:
    assert resolve(path) is not None


def test_python_m_raggedvit_is_the_command_line() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "raggedvit", "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert res.returncode == 0, res.stderr
    for command in ("export", "validate", "info", "bench", "triton-repo", "coverage", "serve"):
        assert f"  {command} " in res.stdout


def test_package_root_is_small() -> None:
    modules = sorted(p.name for p in (ROOT / "raggedvit").glob("*.py"))
    assert len(modules) <= MAX_ROOT_MODULES, modules


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The raggedvit names `path` imports anywhere in it (function-level imports included): `from P import a` names
    the module P.a when there is one, else P."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("raggedvit"):
            out |= {
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module for a in node.names
            }
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("raggedvit")}
    return out


def test_no_import_circles() -> None:
    """No module reaches itself through raggedvit imports, function-level imports counted (a lazy import that only
    hides a circle is still one)."""
    files = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
             for p in (ROOT / "raggedvit").rglob("*.py")}  # fmt: skip

    def module_of(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph = {m: {t for n in _imports(p, set(files)) if (t := module_of(n)) and t != m} for m, p in files.items()}
    done: set[str] = set()

    def visit(m: str, stack: list[str]) -> None:
        if m in stack:
            raise AssertionError("import circle: " + " -> ".join(stack[stack.index(m) :] + [m]))
        if m in done:
            return
        for t in sorted(graph[m]):
            visit(t, [*stack, m])
        done.add(m)

    for m in sorted(graph):
        visit(m, [])
