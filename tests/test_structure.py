"""The shape of the tree: no import circle among our modules, nor among our
packages (each standing for everything under it), the layers of pyproject.toml's
import-linter contracts, no module over 400 lines, and no stage's knowledge
outside ops/ (`op ==`).

The import graph is grimp's (the engine of import-linter), with imports under
TYPE_CHECKING left out: they never run. Function-level imports count: a lazy
import that closes a circle is still a circle, only a later one."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("eagle3_console", "ops")
MAX_LINES = 400


def import_graph(packages: tuple[str, ...] = PACKAGES, depth: int | None = None) -> dict[str, list[str]]:
    """Who imports whom among our modules; with `depth`, among the packages (or
    modules) named by their first `depth` parts, each standing for everything under it."""
    # No cache: the xdist workers would write one cache folder at once.
    graph = grimp.build_graph(*packages, exclude_type_checking_imports=True, cache_dir=None)

    def node(module: str) -> str:
        return module if depth is None else ".".join(module.split(".")[:depth])
    edges: dict[str, set[str]] = {}
    for m in graph.modules:
        edges.setdefault(node(m), set()).update(
            node(x) for x in graph.find_modules_directly_imported_by(m) if x in graph.modules and node(x) != node(m))
    return {n: sorted(to) for n, to in edges.items()}


def import_circles(packages: tuple[str, ...] = PACKAGES, depth: int | None = None) -> list[list[str]]:
    """The import circles among our modules (depth None), or among the packages `depth` parts deep."""
    edges = import_graph(packages, depth)
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


def test_the_package_circle_finder_finds_a_circle_no_module_closes(tmp_path, monkeypatch):
    for pkg, imports in (("pa", "from pb import y\n"), ("pb", "def f():\n    from pa import w\n")):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
        (tmp_path / pkg / "x.py").write_text(imports)
        (tmp_path / pkg / "y.py").write_text("")
        (tmp_path / pkg / "w.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_circles(("pa", "pb")) == []                   # pa.x -> pb.y, pb.x -> pa.w: no module circle
    assert import_circles(("pa", "pb"), depth=1) == [["pa", "pb"]]


def test_no_package_circle():
    """At the top level (eagle3_console, ops: the panes live under the console's
    tui/ since widgets/ and eagle3_console imported each other), and one level
    down (the console's wings and kernel, the stage packages)."""
    assert import_circles(depth=1) == []
    assert import_circles(depth=2) == []


def lint_imports(cwd: Path, config: Path) -> subprocess.CompletedProcess:
    """import-linter's own command on the contracts of `config`, with `cwd` first on the path."""
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run([str(Path(sys.executable).parent / "lint-imports"), "--no-cache", "--config", str(config)],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_a_broken_layer_contract_fails_lint_imports(tmp_path):
    pkg = tmp_path / "layered"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "high.py").write_text("from layered import low\n")
    (pkg / "low.py").write_text("def f():\n    from layered import high\n")
    (tmp_path / "setup.cfg").write_text(textwrap.dedent("""\
        [importlinter]
        root_package = layered

        [importlinter:contract:layers]
        name = high over low
        type = layers
        layers =
            layered.high
            layered.low
        """))
    proc = lint_imports(tmp_path, tmp_path / "setup.cfg")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "layered.low -> layered.high" in proc.stdout


def test_the_import_contracts_hold():
    """pyproject.toml's [tool.importlinter]: ops import nothing of the console,
    the TUI's panes only its model and units, the kernel nothing above it, the TUI's app over its screen over the panes,
    and inside ops the stage packages over ops.spec over the shared modules."""
    proc = lint_imports(ROOT, ROOT / "pyproject.toml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


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


MAX_LAYERS = 8


def top_level_graph(package: str = "eagle3_console") -> dict[str, set[str]]:
    """The imports among `package`'s own modules and packages (its children), each
    package standing for everything under it."""
    graph = grimp.build_graph(package, exclude_type_checking_imports=True, cache_dir=None)

    def child(module: str) -> str | None:
        parts = module.split(".")
        return parts[1] if parts[0] == package and len(parts) > 1 else None

    edges: dict[str, set[str]] = {}
    for module in graph.modules:
        if (src := child(module)) is None:
            continue
        edges.setdefault(src, set())
        for imported in graph.find_modules_directly_imported_by(module):
            if (dst := child(imported)) is not None and dst != src:
                edges[src].add(dst)
    return edges


def layers_deep(edges: dict[str, set[str]]) -> dict[str, int]:
    """Each node's layer: 1 + the deepest layer it imports (1 for a node that imports
    none of the others). A circle has no layering: ValueError naming it."""
    layer: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> int:
        if node in layer:
            return layer[node]
        if node in path:
            raise ValueError("import circle: " + " -> ".join(path[path.index(node):] + [node]))
        path.append(node)
        layer[node] = 1 + max((visit(d) for d in sorted(edges.get(node, ()))), default=0)
        path.pop()
        return layer[node]

    for node in sorted(edges):
        visit(node)
    return layer


def test_the_depth_counter_counts_a_chain_and_refuses_a_circle():
    assert layers_deep({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"c"}}) == {"a": 3, "b": 2, "c": 1, "d": 2}
    with pytest.raises(ValueError, match="a -> b -> a"):
        layers_deep({"a": {"b"}, "b": {"a"}})


def test_eagle3_console_is_at_most_8_layers_deep():
    """The longest chain of imports among eagle3_console's modules and packages
    (cli > tui > actions, observe > runs > monitor > the kernel), no circle among them."""
    layer = layers_deep(top_level_graph())
    deepest = max(layer.values())
    assert deepest <= MAX_LAYERS, sorted(layer.items(), key=lambda kv: -kv[1])
    for wing in ("cli", "tui", "actions", "observe", "runs", "monitor", "kernel"):
        assert wing in layer, f"eagle3_console.{wing} is gone"
