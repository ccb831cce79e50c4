"""A Responses request's ``tools`` and ``tool_choice`` as Chat Completions'. Pure, no I/O.

=============================  ===============================================================
Responses                      Chat Completions
=============================  ===============================================================
``tools`` and the tools of     one list of tools (every tool offered at once: a chat upstream
``additional_tools`` items     has no tools added midway), each as follows
``function``                   ``{"type": "function", "function": {name, description,
                               parameters, strict}}``
``namespace``                  each of its tools, flattened (``<namespace>__<name>``:
                               :class:`~gateway.formats.responses_tools.ToolNames`)
``custom``                     a function taking one string, ``input``, the grammar told in
                               its description (:mod:`gateway.formats.tool_input`)
a hosted tool                  a 400 (the policy's ``hosted_tools = "drop"`` left it out
                               before: :func:`~gateway.formats.responses_tools.without_hosted_tools`)
``tool_choice`` function,      ``{"type": "function", "function": {"name": <its name
custom                         upstream>}}``
``tool_choice`` a hosted tool  a 400 (forcing a tool the upstream cannot run is never met)
no tool left                   ``tool_choice`` ``auto``/``none`` and ``parallel_tool_calls``
                               left out (chat refuses them without tools); ``required`` a 400
=============================  ===============================================================

The namespace's own ``description`` is not offered (each function keeps its own; the name
carries the namespace), nor a function's ``defer_loading`` (every tool is offered at once:
there is no tool search to find a deferred one), ``allowed_callers``, ``output_schema``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gateway.errors import InvalidRequest
from gateway.formats.checks import a_string, invalid_type, invalid_value
from gateway.formats.responses_tools import HOSTED_TOOLS, ToolNames, declared_tools
from gateway.formats.tool_input import custom_description, input_schema

__all__ = ["chat_tool_choice", "chat_tools"]

_FUNCTION_KEYS = ("description", "parameters", "strict")


def _function(tool: dict[str, Any], name: str) -> dict[str, Any]:
    fn = {"name": name, **{k: tool[k] for k in _FUNCTION_KEYS if k in tool}}
    return {"type": "function", "function": fn}


def _format(tool: dict[str, Any], where: str) -> dict[str, Any] | None:
    """A custom tool's ``format``, checked: None (free text) or a grammar."""
    fmt = tool.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise invalid_type(f"{where}.format", "an object", fmt)
    if fmt.get("type") == "text":
        return None
    if fmt.get("type") != "grammar":
        raise invalid_value(f"{where}.format.type", "a custom tool's format type must be "
                            f"'text' or 'grammar', got {fmt.get('type')!r}"[:200])
    a_string(fmt.get("syntax"), f"{where}.format.syntax")
    a_string(fmt.get("definition"), f"{where}.format.definition")
    return fmt


def _custom(tool: dict[str, Any], name: str, where: str) -> dict[str, Any]:
    description = tool.get("description")
    if description is not None:
        a_string(description, f"{where}.description")
    fn: dict[str, Any] = {"name": name}
    text = custom_description(description, _format(tool, where))
    if text:
        fn["description"] = text
    return {"type": "function", "function": {**fn, "parameters": input_schema()}}


def _hosted(kind: str, where: str) -> InvalidRequest:
    return InvalidRequest(f"tool type {kind!r} is run by OpenAI itself; this model's "
                          "upstream cannot run it (the policy's [translation] hosted_tools "
                          "= \"drop\" leaves such tools out)", param=where,
                          code="unsupported_tool")


def _unknown(kind: Any, where: str) -> InvalidRequest:
    return InvalidRequest(f"tool type {str(kind)[:40]!r} cannot be offered to this model's "
                          "upstream", param=where, code="unsupported_tool")


def _member(child: Any, namespace: str, names: ToolNames, where: str) -> dict[str, Any]:
    if not isinstance(child, dict):
        raise invalid_type(where, "a function or custom tool", child)
    name = a_string(child.get("name"), f"{where}.name")
    if child.get("type") == "function":
        return _function(child, names.flat(name, namespace))
    if child.get("type") == "custom":
        return _custom(child, names.flat(name, namespace), where)
    raise _unknown(child.get("type"), f"{where}.type")


def _declared(body: dict[str, Any]) -> Iterator[tuple[Any, str]]:
    """Each tool ``body`` declares, and where (its ``param``): in ``tools`` (checked at the
    door), then in ``additional_tools`` input items (checked here)."""
    for i, tool in enumerate(body.get("tools") or ()):
        yield tool, f"tools[{i}]"
    items = body["input"]
    for k, item in enumerate(items if isinstance(items, list) else ()):
        if item.get("type") == "additional_tools":  # (its "tools" an array: the door's)
            for j, tool in enumerate(item["tools"]):
                where = f"input[{k}].tools[{j}]"
                if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
                    raise invalid_type(where, "a tool object with a 'type'", tool)
                yield tool, where


def chat_tools(body: dict[str, Any]) -> tuple[list[dict[str, Any]], ToolNames]:
    """The chat ``tools`` of a checked Responses ``body`` (those of ``tools`` and of its
    ``additional_tools`` items), and the names they were given; raises InvalidRequest (400)
    naming a tool chat cannot carry."""
    names = ToolNames(declared_tools(body))
    out: list[dict[str, Any]] = []
    for tool, where in _declared(body):
        kind = tool["type"]
        if kind == "function":
            out.append(_function(tool, names.flat(a_string(tool.get("name"),
                                                           f"{where}.name"))))
        elif kind == "custom":
            out.append(_custom(tool, names.flat(a_string(tool.get("name"), f"{where}.name")),
                               where))
        elif kind == "namespace":
            namespace = a_string(tool.get("name"), f"{where}.name")
            members = tool.get("tools")
            if not isinstance(members, list) or not members:
                raise invalid_type(f"{where}.tools", "a non-empty array of tools", members)
            out += [_member(child, namespace, names, f"{where}.tools[{j}]")
                    for j, child in enumerate(members)]
        elif kind in HOSTED_TOOLS:
            raise _hosted(kind, where)
        else:
            raise _unknown(kind, where)
    return out, names


def chat_tool_choice(choice: Any, names: ToolNames, offered: bool) -> Any:
    """The chat ``tool_choice`` of a Responses one (``offered``: whether any tool is; None:
    leave it out); raises InvalidRequest (400) for a choice that cannot be met."""
    if isinstance(choice, str) and not offered:
        if choice == "required":
            raise InvalidRequest("tool_choice 'required', but no tool this model's upstream "
                                 "can run is offered", param="tool_choice",
                                 code="unsupported_tool")
        return None
    if not isinstance(choice, dict):
        return choice
    kind = choice.get("type")
    if kind in ("function", "custom"):
        name = a_string(choice.get("name"), "tool_choice.name")
        namespace = choice.get("namespace")
        flat = names.flat(name, namespace if isinstance(namespace, str) else None)
        return {"type": "function", "function": {"name": flat}}
    if isinstance(kind, str) and kind in HOSTED_TOOLS:
        raise InvalidRequest(f"tool_choice {kind!r} names a tool run by OpenAI itself, which "
                             "this model's upstream cannot run", param="tool_choice",
                             code="unsupported_tool")
    raise InvalidRequest(f"tool_choice {str(kind)[:40]!r} cannot be served by this upstream",
                         param="tool_choice", code="unsupported_tool")
