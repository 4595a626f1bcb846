"""The project's modules import each other without a cycle, and in layers: ``credit_core``
imports none of the project's other packages; no backend imports another.

The graph is read from the source with ``ast``: every ``import`` and ``from ... import``
statement counts, at module level and inside functions alike (a function-level import that
closes a circle only hides it until the function runs), except those under
``if TYPE_CHECKING:``, which never run. ``from pkg import name`` is an edge to ``pkg.name``
when that is a module, else to ``pkg`` (its ``__init__``).

Run it directly to print the cycles, if any::

    python tests/test_import_graph.py
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Collection, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("credit_core", "adapters", "backends", "ablations", "benchmarks")

Graph = dict[str, set[str]]


def project_modules(root: Path = REPO) -> dict[str, Path]:
    """Dotted module name -> source file, for every module of ``PACKAGES``."""
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for file in sorted((root / package).rglob("*.py")):
            parts = list(file.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = file
    return modules


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(
    tree: ast.AST, *, type_checking: bool = False
) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement of ``tree`` at any depth, skipping ``if TYPE_CHECKING:`` unless
    ``type_checking``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node) and not type_checking:
            for child in node.orelse:
                yield from _import_nodes(ast.Module(body=[child], type_ignores=[]))
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        yield from _import_nodes(node, type_checking=type_checking)


def _base_of(module: str, file: Path, node: ast.ImportFrom) -> str:
    """The absolute module named by ``from <node.module> import ...`` inside ``module``."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if file.name == "__init__.py" else module.split(".")[:-1]
    package = package[: len(package) - node.level + 1]
    return ".".join([*package, *([node.module] if node.module else [])])


def import_graph(root: Path = REPO, *, type_checking: bool = False) -> Graph:
    """Module -> the project modules it imports (see the module docstring for the rules;
    ``type_checking`` counts the imports under ``if TYPE_CHECKING:`` too)."""
    modules = project_modules(root)
    graph: Graph = {name: set() for name in modules}
    for name, file in modules.items():
        tree = ast.parse(file.read_text(), filename=str(file))
        for node in _import_nodes(tree, type_checking=type_checking):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = _base_of(name, file, node)
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                    for alias in node.names
                ]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def find_cycles(graph: Graph) -> list[list[str]]:
    """One cycle (``[a, b, ..., a]``) per strongly connected component with more than one
    module (Tarjan's algorithm), in a stable order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_through(graph, set(c), c[0]) for c in sorted(components)]


def _cycle_through(graph: Graph, component: set[str], start: str) -> list[str]:
    """A shortest import path from ``start`` back to itself inside ``component``."""
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & component):
                if nxt == start:
                    return [*paths[node], start]
                if nxt not in paths:
                    paths[nxt] = [*paths[node], nxt]
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"{start} is in a strongly connected component but on no cycle")


def test_the_project_has_no_import_cycle() -> None:
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_credit_core_imports_no_framework() -> None:
    """credit_core needs torch, pydantic and pluggy only (no transformers, no backend)."""
    allowed = {"torch", "pydantic", "pluggy", "credit_core", *sys.stdlib_module_names}
    for name, file in project_modules().items():
        if not name.startswith("credit_core"):
            continue
        for node in _import_nodes(ast.parse(file.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                continue
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            for imported in names:
                top = (imported or "").split(".")[0]
                assert top in allowed, f"{name} imports {imported}"


def imports_from(graph: Graph, importer: str, imported: Collection[str]) -> list[tuple[str, str]]:
    """(module, target) pairs where a module of package ``importer`` imports a module of one
    of the packages ``imported``."""

    def package(module: str) -> str:
        return module.split(".")[0]

    return sorted(
        (module, target)
        for module, targets in graph.items()
        if package(module) == importer
        for target in targets
        if package(target) in imported
    )


def test_credit_core_imports_no_backend_and_no_adapter() -> None:
    """The library stands below every user of it: no module of ``credit_core`` imports
    ``backends`` or ``adapters`` (nor ``ablations``, ``benchmarks``), at any depth, relative
    imports included."""
    assert imports_from(import_graph(), "credit_core", set(PACKAGES) - {"credit_core"}) == []


def test_credit_core_has_no_cycle_even_for_the_type_checker() -> None:
    """Inside the library not even a type annotation closes a circle (a strategy module
    imports the base class; the base class imports no strategy)."""
    graph = import_graph(type_checking=True)
    core = {m: {t for t in ts if t.startswith("credit_core")} for m, ts in graph.items()}
    core = {m: ts for m, ts in core.items() if m.startswith("credit_core")}
    assert find_cycles(core) == []


def test_the_core_check_finds_a_function_level_backend_import(tmp_path: Path) -> None:
    """The check can fail: an import of a backend inside a function, and a relative one
    reaching out of the package, are both found."""
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "backends" / "common.py").write_text("")
    (tmp_path / "adapters" / "policy.py").write_text("")
    (tmp_path / "credit_core" / "a.py").write_text("def f():\n    import backends.common\n")
    (tmp_path / "credit_core" / "b.py").write_text("from ..adapters import policy\n")
    (tmp_path / "credit_core" / "c.py").write_text("from credit_core import a\n")
    assert imports_from(import_graph(tmp_path), "credit_core", {"backends", "adapters"}) == [
        ("credit_core.a", "backends.common"),
        ("credit_core.b", "adapters.policy"),
    ]


#: The backends, each of which may import the shared layers but no other backend.
BACKENDS = ("torch", "trl", "openrlhf", "verl")
#: The layers below the backends: they import no backend.
SHARED_LAYERS = ("common", "samples")


def backend_of(module: str) -> str | None:
    """The folder under ``backends`` that holds ``module`` (None outside ``backends``)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "backends" and len(parts) > 1 else None


def crossing_imports(graph: Graph) -> list[tuple[str, str]]:
    """(importer, imported) pairs that break the layering of ``backends``: a backend importing
    another backend, or a shared layer importing any backend."""
    bad = []
    for module, targets in sorted(graph.items()):
        home = backend_of(module)
        if home not in BACKENDS and home not in SHARED_LAYERS:
            continue
        for target in sorted(targets):
            there = backend_of(target)
            if there in BACKENDS and there != home:
                bad.append((module, target))
    return bad


def test_no_backend_imports_another_and_the_shared_layers_import_none() -> None:
    assert crossing_imports(import_graph()) == []


def test_the_layering_check_finds_a_sibling_import() -> None:
    graph: Graph = {
        "backends.trl.tasks": {"backends.torch.tasks", "backends.common.tasks"},
        "backends.common.tasks": {"backends.verl.config"},
        "backends.torch.tasks": {"backends.common.tasks", "backends.samples.records"},
    }
    assert crossing_imports(graph) == [
        ("backends.common.tasks", "backends.verl.config"),
        ("backends.trl.tasks", "backends.torch.tasks"),
    ]


def test_the_checker_finds_a_function_level_cycle(tmp_path: Path) -> None:
    """The check can fail: a cycle closed by an import inside a function is reported."""
    package = tmp_path / "credit_core"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from credit_core.b import f\n")
    (package / "b.py").write_text("def f():\n    from credit_core import a\n")
    (package / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from credit_core import a\n"
    )
    for other in PACKAGES[1:]:
        (tmp_path / other).mkdir()
    graph = import_graph(tmp_path)
    assert graph["credit_core.c"] == set()
    assert import_graph(tmp_path, type_checking=True)["credit_core.c"] == {"credit_core.a"}
    assert find_cycles(graph) == [["credit_core.a", "credit_core.b", "credit_core.a"]]


if __name__ == "__main__":
    found = find_cycles(import_graph())
    for cycle in found:
        print("import cycle: " + " -> ".join(cycle))
    sys.exit(1 if found else 0)
