"""No import circle in gov/ (issue 31, item 5): no module imports a module that imports it back.

A static check over every ``import`` statement of gov/ (those inside functions too: a
lazy import only moves the circle to run time; those under ``if TYPE_CHECKING:`` are
not imports at run time and are left out), and each simulate module imported alone in
a fresh interpreter, as a user's script or a test would first touch it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import gov

ROOT = Path(gov.__file__).resolve().parent


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node except what sits under ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in [child, *_runtime_nodes(child)])
            continue
        yield node
        yield from _runtime_nodes(node)


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The gov modules ``name`` imports (``from a import b`` is ``a.b`` when b is a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
    return {m for m in found if m in known and m != name}


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_check_finds_a_circle_through_a_lazy_import(tmp_path: Path) -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset({"a", "b", "c"})]
    # the engine ↔ summary circle ran through an import inside a function
    x, y = tmp_path / "x.py", tmp_path / "y.py"
    x.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import gov.z\n"
                 "def f():\n    from gov.y import thing\n")
    y.write_text("from . import x\n")
    known = {"gov.x": x, "gov.y": y, "gov.z": tmp_path / "z.py"}
    assert imports_of("gov.x", x, known) == {"gov.y"}  # not gov.z: only for the type checker
    assert imports_of("gov.y", y, known) == {"gov.x"}


def test_no_import_circle_in_gov() -> None:
    graph = import_graph()
    assert "gov.lab.simulate.summary" in graph["gov.lab.simulate.engine"]  # the graph sees real edges
    found = sorted(sorted(c) for c in cycles(graph))
    assert not found, f"import circles in gov/: {found}"


SIMULATE = sorted(n for n in modules() if n.startswith("gov.lab.simulate"))


@pytest.mark.parametrize("name", SIMULATE)
def test_each_simulate_module_imports_alone(name: str) -> None:
    r = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
