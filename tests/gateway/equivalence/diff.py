"""The first difference between two parsed JSON values, said in a line a person can read.

Object key order never matters (as in Python dict equality), but types do: ``true`` is not
``1`` and ``1`` is not ``1.0`` (Python's ``==`` would say they are). A failure names the
JSON path (``$.messages[3].content``) and shows both sides around where they part, never
whole 30 KB bodies.
"""

from __future__ import annotations

from typing import Any

__all__ = ["first_difference", "same", "shorten", "text_difference"]

#: Characters shown on each side of where two strings part.
WINDOW = 60


def same(a: Any, b: Any) -> bool:
    return first_difference(a, b) is None


def first_difference(client: Any, upstream: Any, path: str = "$") -> str | None:
    """None when equal, else ``"<path>: client <a>, upstream <b>"`` at the first place they
    differ (depth first, in the client's key order)."""
    if type(client) is not type(upstream):
        return f"{path}: client {shorten(client)}, upstream {shorten(upstream)}"
    if isinstance(client, dict):
        for key, value in client.items():
            if key not in upstream:
                return f"{path}: key {key!r} missing upstream (client {shorten(value)})"
            found = first_difference(value, upstream[key], f"{path}.{key}")
            if found is not None:
                return found
        extra = [k for k in upstream if k not in client]
        if extra:
            return (f"{path}: key {extra[0]!r} only upstream "
                    f"(upstream {shorten(upstream[extra[0]])})")
        return None
    if isinstance(client, list):
        for i, (a, b) in enumerate(zip(client, upstream)):
            found = first_difference(a, b, f"{path}[{i}]")
            if found is not None:
                return found
        if len(client) != len(upstream):
            longer, side = (client, "client") if len(client) > len(upstream) else \
                (upstream, "upstream")
            n = min(len(client), len(upstream))
            return (f"{path}: {len(client)} items at the client, {len(upstream)} upstream; "
                    f"{path}[{n}] only {side}: {shorten(longer[n])}")
        return None
    if isinstance(client, str):
        return None if client == upstream else f"{path}: {text_difference(client, upstream)}"
    return None if client == upstream else \
        f"{path}: client {shorten(client)}, upstream {shorten(upstream)}"


def text_difference(client: str, upstream: str) -> str:
    """Where two strings part: the character offset, and a window of each from there."""
    n = 0
    for a, b in zip(client, upstream):
        if a != b:
            break
        n += 1
    start = max(0, n - WINDOW // 2)
    lead = "…" if start else ""

    def window(text: str) -> str:
        tail = "…" if len(text) > n + WINDOW else ""
        return repr(lead + text[start:n + WINDOW] + tail)
    return (f"strings part at character {n} (lengths {len(client)} and {len(upstream)}): "
            f"client {window(client)}, upstream {window(upstream)}")


def shorten(value: Any, limit: int = 120) -> str:
    """``repr``-like JSON of ``value``, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"
