"""The shape of the tree (issue 21): no import circle among our modules, no
module over 400 lines, and no stage's knowledge outside ops/ (`op ==`).

The import graph is grimp's (the engine of import-linter), with imports under
TYPE_CHECKING left out: they never run. Function-level imports count: a lazy
import that closes a circle is still a circle, only a later one."""

from __future__ import annotations

import re
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("eagle3_console", "ops", "widgets")
MAX_LINES = 400


def import_circles(packages: tuple[str, ...] = PACKAGES) -> list[list[str]]:
    graph = grimp.build_graph(*packages, exclude_type_checking_imports=True)
    edges = {m: [x for x in graph.find_modules_directly_imported_by(m) if x in graph.modules and x != m]
             for m in graph.modules}
    # Strongly connected components (Tarjan, iterative): each one of several modules is a circle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        comp.append(member)
                        if member == node:
                            break
                    if len(comp) > 1:
                        circles.append(sorted(comp))
    return sorted(circles)


def sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def test_the_circle_finder_finds_a_circle(tmp_path, monkeypatch):
    pkg = tmp_path / "circ"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from circ import b\n")
    (pkg / "b.py").write_text("def f():\n    from circ import a\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from circ import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_circles(("circ",)) == [["circ.a", "circ.b"]]


def test_no_import_circle():
    assert import_circles() == []


def test_no_module_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in sources() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_no_op_comparison_outside_ops():
    """A stage's knowledge lives in its spec (ops/<op>/spec.py): the console asks
    the spec's hooks, never `stage.op == "train"`."""
    pattern = re.compile(r"""\.op\s*(==|!=|\bin\b|\bnot in\b)|\bop\s*(==|!=)\s*['"]""")
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
            for p in sources() if not p.relative_to(ROOT).parts[0] == "ops"
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []
