"""A Responses request's tools as an upstream without the Responses API is offered them
(through Chat Completions, and from there Anthropic's Messages), and its calls named back
as the client declared them. Pure, no I/O.

- ``function`` tools keep their name.
- ``namespace`` tools (the openai SDK's ``NamespaceTool``: function and custom tools the
  client runs itself, grouped under a name; Codex CLI sends its MCP and agent tools so) are
  flattened: each of their tools becomes one function named ``<namespace>__<name>``
  (``functions``, what OpenAI's models call the top level, adds no prefix), its characters
  outside ``[a-zA-Z0-9_-]`` made ``_``, cut to 64 with a hash of the whole when longer
  (what both OpenAI's function names and Anthropic's tool names accept), ``_2``, ``_3``...
  after a name already taken (the client's top-level names first, as they came). A call of
  it comes back as a ``function_call`` (or ``custom_tool_call``) item with the original
  ``name`` and its ``namespace``, as OpenAI returns it.
- ``custom`` tools (freeform text input, with or without a grammar) are offered as a function
  taking one string, ``input`` (:mod:`gateway.formats.tool_input`), and come back as
  ``custom_tool_call`` items (``input``: the text).
- Hosted tools (:data:`HOSTED_TOOLS`, run by OpenAI itself) cannot be offered: the policy
  drops them (:func:`without_hosted_tools`) or the translation refuses them.

A request declares tools in ``tools`` and in ``additional_tools`` input items (``{"type":
"additional_tools", "role": "developer", "tools": [...]}``: Codex CLI 0.171 sends all of its
tools so, none in ``tools``): an upstream without the Responses API is offered them all at
once (:func:`declared_tools`). :class:`ToolNames` is a pure function of them, so the
request's translation and its answer's (whole or streamed) map the same names the same way.

Sources: https://platform.openai.com/docs/api-reference/responses/create (``tools``), the
openai SDK's ``NamespaceTool``, ``CustomTool``, ``ResponseFunctionToolCall.namespace`` and
``ResponseCustomToolCall``; https://docs.anthropic.com/en/api/messages (tool names).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from gateway.formats.ids import random_hex
from gateway.formats.tool_input import custom_input

__all__ = ["HOSTED_TOOLS", "ToolNames", "ToolRef", "call_item", "declared_tools",
           "hosted_tools", "without_hosted_tools"]

#: Tools the provider runs itself (or that only its own models know how to call): only a
#: native upstream can serve them. (The openai SDK's ``Tool`` union, less ``function``,
#: ``custom`` and ``namespace``; dated variants included.)
HOSTED_TOOLS = frozenset({
    "web_search", "web_search_2025_08_26", "web_search_preview",
    "web_search_preview_2025_03_11", "file_search", "code_interpreter", "computer",
    "computer_use", "computer_use_preview", "image_generation", "mcp", "local_shell",
    "shell", "apply_patch", "tool_search", "programmatic_tool_calling"})

#: The namespace OpenAI's models put top-level tools in: no prefix for its tools.
DEFAULT_NAMESPACE = "functions"
#: The longest name an upstream accepts (OpenAI's functions, Anthropic's tools).
MAX_NAME = 64
_BAD_CHARS = re.compile(r"[^a-zA-Z0-9_-]")


def _added(item: Any) -> bool:
    """Whether ``item`` is an ``additional_tools`` input item with its array of tools."""
    return isinstance(item, dict) and item.get("type") == "additional_tools" and isinstance(
        item.get("tools"), list)


def declared_tools(body: dict[str, Any]) -> list[Any]:
    """Every tool ``body`` declares: its ``tools``, then those of its ``additional_tools``
    input items, in order (as they came: not checked)."""
    tools, items = body.get("tools"), body.get("input")
    out = list(tools) if isinstance(tools, list) else []
    if isinstance(items, list):
        for item in items:
            if _added(item):
                out += item["tools"]
    return out


@dataclass(frozen=True, slots=True)
class ToolRef:
    """A tool as the client declared it: its ``name``, its ``namespace`` (None at the top
    level) and whether it is a ``custom`` (freeform) tool."""

    name: str
    namespace: str | None = None
    custom: bool = False


def _flattened(name: str, namespace: str | None) -> str:
    """The name a namespaced tool is offered under, before any collision is resolved."""
    whole = name if namespace in (None, DEFAULT_NAMESPACE) else f"{namespace}__{name}"
    flat = _BAD_CHARS.sub("_", whole) or "_"
    if len(flat) > MAX_NAME:
        digest = hashlib.sha256(whole.encode("utf-8", "replace")).hexdigest()[:8]
        flat = f"{flat[:MAX_NAME - 9]}_{digest}"
    return flat


class ToolNames:
    """The names a translated upstream is offered, both ways: :meth:`flat` (a declared
    tool's name upstream) and :meth:`ref` (an upstream name's tool as declared). Built from
    a request's ``tools`` as they came, malformed entries and hosted tools skipped (the
    request's translation refuses the malformed ones first)."""

    __slots__ = ("_flat", "_refs")

    def __init__(self, tools: Any) -> None:
        self._refs: dict[str, ToolRef] = {}
        self._flat: dict[tuple[str | None, str], str] = {}
        nested: list[ToolRef] = []
        for tool in tools if isinstance(tools, list) else ():
            if not isinstance(tool, dict):
                continue
            kind, name = tool.get("type"), tool.get("name")
            if kind in ("function", "custom") and isinstance(name, str):
                # the client's own top-level names first, as they came (the first of twins)
                if (None, name) not in self._flat:
                    self._refs.setdefault(name, ToolRef(name, None, kind == "custom"))
                    self._flat[(None, name)] = name
            elif kind == "namespace" and isinstance(name, str) and isinstance(
                    tool.get("tools"), list):
                nested += [ToolRef(child["name"], name, child.get("type") == "custom")
                           for child in tool["tools"] if isinstance(child, dict)
                           and child.get("type") in ("function", "custom")
                           and isinstance(child.get("name"), str)]
        for ref in nested:
            key = (ref.namespace, ref.name)
            if key in self._flat:
                continue
            flat = base = _flattened(ref.name, ref.namespace)
            n = 1
            while flat in self._refs:
                n += 1
                suffix = f"_{n}"
                flat = base[:MAX_NAME - len(suffix)] + suffix
            self._refs[flat] = ref
            self._flat[key] = flat

    def flat(self, name: str, namespace: str | None = None) -> str:
        """The name upstream of the tool ``name`` (in ``namespace``); for a tool not
        declared (an earlier turn's), the name it would have had."""
        found = self._flat.get((namespace, name))
        if found is None and namespace == DEFAULT_NAMESPACE:
            found = self._flat.get((None, name))
        return found if found is not None else (
            name if namespace is None else _flattened(name, namespace))

    def ref(self, flat: str) -> ToolRef | None:
        """The declared tool offered as ``flat``; None for a name the request never
        offered (a model's invention: its call goes back under that name)."""
        return self._refs.get(flat)


def call_item(call: Any, names: ToolNames | None) -> dict[str, Any]:
    """A chat tool call (``{"id", "type": "function", "function": {"name", "arguments"}}``)
    as the client's output item: a ``custom_tool_call`` (``input``: its text) for a custom
    tool, else a ``function_call``; named as the client declared it, with its
    ``namespace`` when it has one."""
    fn = call.get("function") if isinstance(call, dict) else None
    fn = fn if isinstance(fn, dict) else {}
    name, arguments = fn.get("name"), fn.get("arguments", "")
    ref = names.ref(name) if names is not None and isinstance(name, str) else None
    call_id = call.get("id") if isinstance(call, dict) else None
    if ref is not None and ref.custom:
        item: dict[str, Any] = {
            "type": "custom_tool_call", "id": "ctc_" + random_hex(), "call_id": call_id,
            "name": ref.name, "input": custom_input(arguments if isinstance(arguments, str)
                                                    else ""), "status": "completed"}
    else:
        item = {"type": "function_call", "id": "fc_" + random_hex(), "call_id": call_id,
                "name": ref.name if ref is not None else name, "arguments": arguments,
                "status": "completed"}
    if ref is not None and ref.namespace is not None:
        item["namespace"] = ref.namespace
    return item


def _hosted(tool: Any) -> bool:
    return isinstance(tool, dict) and isinstance(tool.get("type"), str) and \
        tool["type"] in HOSTED_TOOLS


def hosted_tools(body: dict[str, Any]) -> tuple[str, ...]:
    """The types of the hosted tools ``body`` declares, each once, in order."""
    return tuple(dict.fromkeys(t["type"] for t in declared_tools(body) if _hosted(t)))


def without_hosted_tools(body: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """``body`` without its hosted tools (in ``tools`` and in ``additional_tools`` items),
    and their types (``body`` itself and ``()`` when it has none; the client's body is
    never changed). A ``tool_choice`` naming one stays, for the translation to refuse."""
    dropped = hosted_tools(body)
    if not dropped:
        return body, ()
    out = dict(body)
    if isinstance(body.get("tools"), list):
        out["tools"] = [t for t in body["tools"] if not _hosted(t)]
    if isinstance(body.get("input"), list):
        out["input"] = [{**item, "tools": [t for t in item["tools"] if not _hosted(t)]}
                        if _added(item) else item for item in body["input"]]
    return out, dropped
