"""Which code the serving gateway loads: never the offline tools, never the test helpers.

The tools' dependencies (scikit-learn, rich, the openai SDK) come with an optional extra, so
a server installed without it must start; and test helpers have no place in production.
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
