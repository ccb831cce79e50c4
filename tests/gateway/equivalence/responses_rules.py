"""The contract's rule for a Responses request's tools (in ``tools`` and in
``additional_tools`` input items) on their way to each kind of upstream (T1), checked from
what the client sent, what the upstream received and the answer's
``x-gateway-dropped-tools`` header, independently of the gateway's own code:

- to an upstream serving ``/v1/responses`` itself: every tool as it came (P1's reordering
  aside), and no header;
- translated (to chat completions, or Anthropic's Messages): one function per tool the
  client runs itself (a function, a custom tool, each tool of a namespace), under unique
  names an upstream accepts (``^[a-zA-Z0-9_-]{1,64}$`` wherever the client's own were), a
  top-level tool under its own name; no hosted tool (the policy drops them by default:
  :data:`HOSTED`); the header names exactly the hosted types the client offered, each once,
  in order, and is absent when it offered none.
"""

from __future__ import annotations

import re
from typing import Any

from tests.gateway.equivalence.diff import shorten
from tests.gateway.equivalence.rules import canonical

__all__ = ["HOSTED", "responses_tools"]

#: Tool types OpenAI runs itself (the openai SDK's ``Tool`` union less function, custom and
#: namespace): what a translated upstream is never offered.
HOSTED = frozenset({
    "web_search", "web_search_2025_08_26", "web_search_preview",
    "web_search_preview_2025_03_11", "file_search", "code_interpreter", "computer",
    "computer_use", "computer_use_preview", "image_generation", "mcp", "local_shell",
    "shell", "apply_patch", "tool_search", "programmatic_tool_calling"})
_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


def _kind(tool: Any) -> Any:
    return tool.get("type") if isinstance(tool, dict) else None


def _runs_itself(tools: list[Any]) -> tuple[list[str], list[tuple[Any, Any]]]:
    """The client's top-level names of the tools it runs itself, and each function they
    make as (namespace, name) (a namespace's tools each one)."""
    names, made = [], []
    for tool in tools:
        if _kind(tool) in ("function", "custom"):
            names.append(tool["name"])
            made.append((None, tool["name"]))
        elif _kind(tool) == "namespace":
            made += [(tool["name"], member.get("name")) for member in tool["tools"]]
    return names, made


def _declared(body: Any) -> list[Any]:
    """The tools of ``body``'s ``tools``, then of its ``additional_tools`` items."""
    if not isinstance(body, dict):
        return []
    tools, items = body.get("tools"), body.get("input")
    out = list(tools) if isinstance(tools, list) else []
    for item in items if isinstance(items, list) else ():
        if isinstance(item, dict) and item.get("type") == "additional_tools" and isinstance(
                item.get("tools"), list):
            out += item["tools"]
    return out


def _offered(upstream: str, received: dict[str, Any]) -> list[Any]:
    tools = received.get("tools") or []
    if upstream == "anthropic":
        return [t.get("name") for t in tools]
    return [(t.get("function") or {}).get("name") for t in tools]


def responses_tools(upstream: str, client: dict[str, Any], received: Any,
                    dropped: str | None) -> str | None:
    """T1 for a 200 answer to a Responses request ``client`` that reached an upstream of
    ``upstream``'s API (``responses`` natively, ``openai`` chat, ``anthropic``), which
    received ``received`` (parsed); ``dropped``: the answer's ``x-gateway-dropped-tools``.
    None when it holds, else what breaks it."""
    tools = _declared(client)
    if upstream == "responses":
        if dropped is not None:
            return f"x-gateway-dropped-tools: {dropped!r} from a native upstream (T1)"
        theirs = _declared(received)
        if sorted(map(canonical, tools)) != sorted(map(canonical, theirs)):
            return (f"$.tools: a native upstream must get every tool as it came (T1), got "
                    f"{shorten(theirs)}")
        return None
    hosted = list(dict.fromkeys(t for t in map(_kind, tools) if t in HOSTED))
    expected = ", ".join(hosted) if hosted else None
    if dropped != expected:
        return f"x-gateway-dropped-tools: {dropped!r}, the client's hosted tools: {hosted} (T1)"
    names, made = _runs_itself(tools)
    offered = _offered(upstream, received if isinstance(received, dict) else {})
    if len(offered) != len(made):
        return (f"$.tools: {len(made)} functions expected upstream (T1: one per tool the "
                f"client runs), got {len(offered)}: {shorten(offered)}")
    if not all(name in offered for name in names):
        return f"$.tools: a top-level tool's name changed (T1): {names} -> {offered}"
    if len(set(made)) == len(made) and len(set(offered)) != len(offered):
        return f"$.tools: two tools offered under one name (T1): {offered}"
    if all(isinstance(n, str) and _NAME.fullmatch(n) for n in names) and not all(
            isinstance(n, str) and _NAME.fullmatch(n) for n in offered):
        return f"$.tools: a name upstream would refuse (T1): {offered}"
    return None
