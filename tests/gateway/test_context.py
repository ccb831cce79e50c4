"""The log record is no data bus: no stage, nor dispatch, reads a field of it.

A stage writes its own decisions into ``ctx.record`` (cache layer, route tier...) and reads
whatever it shares with others from the context (``ctx.usage``, ``ctx.upstream``,
``ctx.ttft_ms``...); the endpoint fills the record from the context once, at the end.
"""

from __future__ import annotations

import ast
from pathlib import Path

import gateway

PACKAGE = Path(gateway.__file__).parent
REQUEST_PATH = [*sorted((PACKAGE / "stages").glob("*.py")), PACKAGE / "dispatch.py",
                PACKAGE / "outbound.py",
                PACKAGE / "cache" / "cache.py"]


def _record_reads(path: Path) -> list[str]:
    """``x.field`` loads where ``x`` is the record: ``ctx.record``, or a name bound to it
    (``rec = ctx.record``) or given it (a parameter named ``rec`` or ``record``)."""
    tree = ast.parse(path.read_text(), str(path))
    names = {"rec", "record"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and _is_record(node.value, set()):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return [f"{path.name}:{node.lineno}: {ast.unparse(node)}" for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)
            and _is_record(node.value, names)]


def _is_record(node: ast.expr, names: set[str]) -> bool:
    if isinstance(node, ast.Name):
        return node.id in names
    return isinstance(node, ast.Attribute) and node.attr == "record" and \
        isinstance(node.value, ast.Name) and node.value.id == "ctx"


def test_no_stage_reads_the_log_record() -> None:
    reads = [read for path in REQUEST_PATH for read in _record_reads(path)]
    assert reads == []
