"""The map of harness/ holds: the import contracts of pyproject.toml pass, no two modules import each other
(through any chain, counting imports inside functions and under TYPE_CHECKING), and no module outgrows one idea."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
MAX_MODULE_LINES = 450

pytestmark = pytest.mark.timeout(300)


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    """`lint-imports` on the package under `root`, with the contracts of root/pyproject.toml."""
    env = {**os.environ, "PYTHONPATH": str(root)}  # ahead of the editable install: this copy's harness
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=240)


def test_the_import_contracts_hold():
    r = _lint_imports(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 kept, 0 broken" in r.stdout


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "harness", tmp_path / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    return tmp_path


@pytest.mark.parametrize("module, line", [
    ("compute/model.py", "from ..cli import build_parser"),  # the library imports the CLI, at the top
    ("scheduler/cost.py", "def f():\n    from harness.cli.run import register"),  # ... or inside a function
    ("compute/profiles.py", "def f():\n    from ..train import launch"),  # a layer imports one above it
])
def test_the_contracts_fail_when_a_module_imports_against_the_layers(tmp_path, module, line):
    root = _copy(tmp_path)
    path = root / "harness" / module
    path.write_text(path.read_text() + "\n\n" + line + "\n")
    r = _lint_imports(root)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "BROKEN" in r.stdout
    target = line.split("from ")[-1].split(" import")[0]
    imported = {"..cli": "harness.cli", "harness.cli.run": "harness.cli.run", "..train": "harness.train"}[target]
    assert f"harness.{module[:-3].replace('/', '.')} -> {imported}" in r.stdout


def _cycles(package: str) -> list[list[str]]:
    """The import cycles between modules of `package` (strongly connected parts of more than one module)."""
    graph = grimp.build_graph(package)  # every import statement: top level, in functions, under TYPE_CHECKING
    edges = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while not part or part[-1] != v:
                part.append(stack.pop())
                on_stack.discard(part[-1])
            if len(part) > 1:
                out.append(sorted(part))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(edges)))
    for m in sorted(edges):
        if m not in index:
            visit(m)
    return out


def test_no_import_cycles():
    assert _cycles("harness") == []


def test_the_cycle_check_finds_a_cycle(tmp_path, monkeypatch):
    pkg = tmp_path / "cyc"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from . import c\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n")
    (pkg / "d.py").write_text("from . import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _cycles("cyc") == [["cyc.a", "cyc.b", "cyc.c"]]


def test_no_module_over_450_lines():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in (ROOT / "harness").rglob("*.py")}
    assert {p: n for p, n in sizes.items() if n > MAX_MODULE_LINES} == {}


def test_the_top_level_holds_only_the_ground_floor():
    """Everything but the ground floor (errors, files, units, results) lives in a layer's package."""
    top = sorted(p.name for p in (ROOT / "harness").glob("*.py"))
    assert top == ["__init__.py", "__main__.py", "errors.py", "files.py", "results.py", "units.py"]
