"""Which code the serving gateway loads, and how its modules depend on each other.

Never the offline tools, never the test helpers: the tools' dependencies (scikit-learn,
rich, the openai SDK) come with an optional extra, so a server installed without it must
start; and test helpers have no place in production. And no import cycle among the
``gateway`` modules, counting imports inside functions and under ``TYPE_CHECKING``: the
request path can be read one way, from the stage table down.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import gateway

PACKAGE = Path(gateway.__file__).parent
OFFLINE = ("gateway.testing", "gateway.tools")


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at its top or inside a function."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_serving_code_imports_neither_the_tools_nor_the_test_helpers() -> None:
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent.name in ("testing", "tools"):
            continue
        bad = sorted(n for n in _imports(path) if n.startswith(OFFLINE))
        if bad:
            offenders[str(path.relative_to(PACKAGE.parent))] = bad
    assert offenders == {}


def test_the_gateway_command_loads_no_tool_until_one_is_named() -> None:
    # A fresh interpreter: this one already imported the tools for their own tests.
    code = ("import sys, gateway.cli; print(sorted(m for m in sys.modules if "
            "m.startswith('gateway.tools') or m.split('.')[0] in ('sklearn', 'openai')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """Module -> the gateway modules it imports anywhere in its file (at its top, inside a
    function, under TYPE_CHECKING). ``from gateway.x import y`` is ``gateway.x.y`` when that
    is a module, else ``gateway.x``; a name that is no module counts as its nearest parent
    that is (a package without ``__init__.py`` is not one)."""
    paths = {_module_name(path): path for path in PACKAGE.rglob("*.py")}

    def nearest(name: str) -> str | None:
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        names: list[str] = []
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.extend(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package, `level - 1` levels up
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                names.extend(f"{base}.{alias.name}" if f"{base}.{alias.name}" in paths
                             else base for alias in node.names)
        graph[module] = {n for n in map(nearest, names) if n is not None and n != module}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as the modules along it, the first repeated at the end; None
    when there is none (depth-first search: an edge back into the current path)."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(module: str) -> list[str] | None:
        path.append(module)
        on_path.add(module)
        for child in sorted(graph[module]):
            if child in on_path:
                return [*path[path.index(child):], child]
            if child not in done and (found := visit(child)) is not None:
                return found
        path.pop()
        on_path.discard(module)
        done.add(module)
        return None

    for module in sorted(graph):
        if module not in done and (found := visit(module)) is not None:
            return found
    return None


def test_the_gateway_modules_import_each_other_without_a_cycle() -> None:
    graph = _import_graph()
    assert "gateway.stage_table" in graph["gateway.pipeline"]  # the graph sees imports
    assert "gateway.stages.route" in graph["gateway.stage_table"]
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


def test_the_cycle_finder_reports_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"b", "d"}, "d": set()}
    assert _cycle(graph) == ["b", "c", "b"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_engine_and_the_wire_package_import_nothing_from_the_gateway() -> None:
    root = PACKAGE.parent
    offenders = {str(path.relative_to(root)): sorted(bad)
                 for package in ("local_engine", "llm_wire")
                 for path in sorted((root / package).rglob("*.py"))
                 if (bad := {n for n in _imports(path) if n.split(".")[0] == "gateway"})}
    assert offenders == {}
