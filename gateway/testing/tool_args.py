"""The fakes' tool calls: which tool of a request's to call, and arguments valid for it.

Two kinds of steering, by the ``x-fake-tool`` header, in each API the fakes speak (chat
completions, Responses, Anthropic Messages):

- ``agent``: answer as a model driving an agent would, so that a real client's own tool runs.
  The tool is chosen by name from ``x-fake-tool-prefer`` (comma-separated), else
  :data:`PREFERRED` (the shell and read tools of Claude Code, Codex and opencode), else the
  first tool offered. Its arguments are made from its own JSON Schema (:func:`arguments`):
  the required properties, of their types, enums and bounds, with values that mean something
  for well-known names (``command``/``cmd``: :data:`COMMAND`; ``file_path``/``filePath``/
  ``path``: :data:`FILE` in the client's working directory; a freeform ``exec`` tool that
  runs JavaScript, Codex's code mode: a script calling ``exec_command`` with :data:`COMMAND`).
  Once the conversation holds a tool result (chat: a ``tool`` message; Responses: any
  ``*_output`` item; Anthropic: a ``tool_result`` block) the answer is text, so the agent's
  loop ends. The working directory is ``x-fake-tool-dir``, else the one the request names
  (Claude Code's "Primary working directory: ...", Codex's ``<cwd>...</cwd>``, opencode's
  "Working directory: ..."), else none (a relative path).
- any other value: the request's first function tool (Anthropic: custom tool) with
  ``{"x": 1}`` or the JSON of ``x-fake-tool-args``; chat and Responses, with ``once``: only
  while no tool result is in the conversation.

Tools are read where each API puts them: chat ``tools[].function``; Responses ``tools`` and
the ``tools`` of ``additional_tools`` input items (Codex), ``function`` and ``custom``
(freeform) tools, inside ``namespace`` tools too (the call then names its namespace);
Anthropic ``tools`` without a server-tool ``type``.

:data:`MARKER` is what :data:`COMMAND` prints: a test that writes it into :data:`FILE` sees it
in the tool result the client sends back whichever tool ran, and only if one ran (the call's
own arguments never contain it).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = ["COMMAND", "FILE", "MARKER", "PREFERRED", "Tool", "anthropic_tool_use", "arguments",
           "chat_tool_call", "choose", "offered", "responses_call", "tool_results", "workdir"]

#: What the tools the fake calls print or read: "compat-42", never in the call itself.
MARKER = "compat-42"
COMMAND = "echo compat-$((40+2))"
#: The file a read tool is asked for, in the client's working directory.
FILE = "compat.txt"
#: Tool names preferred, in order: shells (Claude Code's, opencode's, Codex's code mode
#: and its older shell tools), then file readers, then Codex's patch tool.
PREFERRED = ("Bash", "bash", "exec", "exec_command", "shell_command", "shell", "local_shell",
             "Read", "read", "read_file", "apply_patch")
_JS = f'const r = await tools.exec_command({{cmd: "{COMMAND}"}});\ntext(r.output);\n'
_PATCH = "*** Begin Patch\n*** Add File: compat-patch.txt\n+compat\n*** End Patch\n"
_CWD = re.compile(r"(?:working directory|<cwd>)\s*:?\s*(/[^\s<\"\\]*)", re.IGNORECASE)
_SEPARATORS = re.compile(r"__|[.:/]")


@dataclass(frozen=True)
class Tool:
    """A tool a request offers: ``schema`` (JSON Schema of a function's arguments) or
    ``custom`` (freeform text input); ``namespace``: the Responses namespace it is in."""

    name: str
    schema: Any = None
    custom: bool = False
    description: str = ""
    namespace: str | None = None


def offered(api: str, data: Any) -> list[Tool]:
    """The tools ``data`` (a request body of ``api``: chat, responses, anthropic) offers."""
    if not isinstance(data, dict):
        return []
    if api == "anthropic":
        return [Tool(t["name"], t.get("input_schema"), description=str(t.get("description", "")))
                for t in _dicts(data.get("tools")) if t.get("type") in (None, "custom")
                and isinstance(t.get("name"), str)]
    if api == "chat":
        return [Tool(f["name"], f.get("parameters"), description=str(f.get("description", "")))
                for t in _dicts(data.get("tools")) if t.get("type") == "function"
                for f in _dicts([t.get("function")]) if isinstance(f.get("name"), str)]
    extra = [t for item in _dicts(data.get("input")) if item.get("type") == "additional_tools"
             for t in _dicts(item.get("tools"))]
    return list(_responses_tools([*_dicts(data.get("tools")), *extra], None))


def _responses_tools(tools: Iterable[dict[str, Any]], namespace: str | None) -> Iterable[Tool]:
    for tool in tools:
        kind, name = tool.get("type"), tool.get("name")
        if kind == "namespace":
            yield from _responses_tools(_dicts(tool.get("tools")), str(name))
        elif kind in ("function", "custom") and isinstance(name, str):
            yield Tool(name, tool.get("parameters"), kind == "custom",
                       str(tool.get("description", "")), namespace)


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def tool_results(api: str, data: Any) -> list[str]:
    """The text of each tool result in the conversation of ``data`` (as :func:`offered`)."""
    if not isinstance(data, dict):
        return []
    if api == "anthropic":
        return [_text(b.get("content")) for m in _dicts(data.get("messages"))
                if isinstance(m.get("content"), list)
                for b in _dicts(m["content"]) if b.get("type") == "tool_result"]
    if api == "chat":
        return [_text(m.get("content")) for m in _dicts(data.get("messages"))
                if m.get("role") in ("tool", "function")]
    items = data.get("input")
    return [_text(i.get("output")) for i in _dicts(items)
            if str(i.get("type", "")).endswith("_output")]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_text(c.get("text", c.get("output", ""))) if isinstance(c, dict)
                         else _text(c) for c in content)
    return "" if content is None else orjson.dumps(content).decode()


def _any_result(api: str, data: Any, conversation: list[dict[str, Any]] | None) -> bool:
    if conversation is not None:  # Responses: the kept conversation and this input
        return any(str(i.get("type", "")).endswith("_output") for i in conversation)
    return bool(tool_results(api, data))


def choose(tools: list[Tool], prefer: Iterable[str] = PREFERRED) -> Tool | None:
    """The first tool whose name is in ``prefer``, in its order, less a namespace prefix
    (``ns__``, ``ns.``; else ``ns_``: how a gateway may flatten a namespace); else the first
    tool; None when there are none."""
    for wanted in prefer:
        for tool in tools:
            if _SEPARATORS.split(tool.name)[-1] == wanted:
                return tool
        for tool in tools:
            if tool.name.endswith("_" + wanted):
                return tool
    return tools[0] if tools else None


def workdir(data: Any, headers: dict[str, str]) -> str | None:
    """The client's working directory: ``x-fake-tool-dir``, else the one the request names."""
    if headers.get("x-fake-tool-dir"):
        return headers["x-fake-tool-dir"]
    found = _CWD.search(orjson.dumps(data).decode()) if data is not None else None
    return found.group(1).rstrip("/.,;") if found else None


def arguments(tool: Tool, cwd: str | None = None) -> str:
    """What to call ``tool`` with: JSON of arguments valid for its schema, or (a custom
    tool) its freeform text. Known tools get meaningful values (module docstring)."""
    text = _freeform(tool)
    if tool.custom:
        return text
    schema = tool.schema if isinstance(tool.schema, dict) else {"type": "object"}
    strings = [k for k, v in _properties(schema).items() if isinstance(v, dict)
               and v.get("type") == "string"]
    if text != "compat" and len(strings) == 1:  # a freeform tool offered as a function
        return orjson.dumps({strings[0]: text}).decode()
    value = _value(schema, schema, "", cwd, 0)
    return orjson.dumps(value if isinstance(value, dict) else {}).decode()


def _properties(schema: dict[str, Any]) -> dict[str, Any]:
    found = schema.get("properties")
    return found if isinstance(found, dict) else {}


def _freeform(tool: Tool) -> str:
    name = _SEPARATORS.split(tool.name)[-1]
    if name.endswith("exec") and "javascript" in tool.description.lower():
        return _JS
    return _PATCH if name.endswith("apply_patch") else "compat"


def _value(schema: Any, root: Any, key: str, cwd: str | None, depth: int) -> Any:
    """A value for ``schema`` at property ``key``: required properties only, known keys
    meaningful, bounds kept."""
    if not isinstance(schema, dict) or depth > 32:
        return None
    if isinstance(schema.get("$ref"), str):
        target: Any = root
        for part in schema["$ref"].lstrip("#/").split("/"):
            target = target.get(part, {}) if isinstance(target, dict) else {}
        return _value(target, root, key, cwd, depth + 1)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    for branch in ("anyOf", "oneOf", "allOf"):
        options = [s for s in schema.get(branch) or () if isinstance(s, dict)
                   and s.get("type") != "null"]
        if options:
            return _value(options[0], root, key, cwd, depth + 1)
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    lowered = key.lower().replace("_", "")
    if kind == "object":
        properties = _properties(schema)
        required = [k for k in schema.get("required") or () if k in properties]
        return {k: _value(properties[k], root, k, cwd, depth + 1) for k in required}
    if kind == "array":
        if lowered in ("command", "cmd"):
            return ["bash", "-lc", COMMAND]
        count = max(int(schema.get("minItems", 0)), 1 if lowered in ("paths", "files") else 0)
        return [_value(schema.get("items"), root, key.rstrip("s"), cwd, depth + 1)] * count
    if kind in ("integer", "number"):
        above = schema.get("exclusiveMinimum")
        low = schema.get("minimum", above + 1 if isinstance(above, (int, float))
                         and not isinstance(above, bool) else 1)
        high = schema.get("maximum")
        low = min(low, high) if isinstance(high, (int, float)) else low
        return int(low) if kind == "integer" else float(low)
    if kind == "boolean":
        return False
    if kind != "string":
        return None
    if lowered in ("command", "cmd"):
        return COMMAND
    if lowered in ("filepath", "path", "file", "filename", "absolutepath", "notebookpath"):
        return f"{cwd.rstrip('/')}/{FILE}" if cwd else FILE
    return "compat".ljust(int(schema.get("minLength", 0)), "x")


def _steer(headers: dict[str, str]) -> str:
    return headers.get("x-fake-tool", "")


def _agent_call(api: str, data: Any, headers: dict[str, str],
                conversation: list[dict[str, Any]] | None = None) -> tuple[Tool, str] | None:
    if _any_result(api, data, conversation):
        return None
    prefer = [p.strip() for p in headers.get("x-fake-tool-prefer", "").split(",") if p.strip()]
    tool = choose(offered(api, data), prefer or PREFERRED)
    return None if tool is None else (tool, arguments(tool, workdir(data, headers)))


def chat_tool_call(data: Any, headers: dict[str, str]) -> dict[str, Any] | None:
    """The chat ``tool_calls`` entry the ``x-fake-tool`` header asks for, else None."""
    steer = _steer(headers)
    if not steer or not isinstance(data, dict):
        return None
    if steer == "agent":
        call = _agent_call("chat", data, headers)
        return None if call is None else {"id": f"call_{uuid.uuid4().hex[:24]}",
                                          "type": "function", "function": {
                                              "name": call[0].name, "arguments": call[1]}}
    if steer == "once" and tool_results("chat", data):  # an agent loop ends after one call
        return None
    for tool in offered("chat", data)[:1]:
        return {"id": "call_fake0", "type": "function", "function": {
            "name": tool.name, "arguments": headers.get("x-fake-tool-args", '{"x": 1}')}}
    return None


def responses_call(data: dict[str, Any], headers: dict[str, str],
                   conversation: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The Responses output item (``function_call`` or ``custom_tool_call``) the
    ``x-fake-tool`` header asks for, else None; ``conversation``: every item so far."""
    steer = _steer(headers)
    call_id, item_id = f"call_{uuid.uuid4().hex}", uuid.uuid4().hex
    if steer == "agent":
        call = _agent_call("responses", data, headers, conversation)
        if call is None:
            return None
        tool, args = call
        item = {"id": f"ctc_{item_id}", "type": "custom_tool_call", "status": "completed",
                "call_id": call_id, "name": tool.name, "input": args} if tool.custom else {
            "id": f"fc_{item_id}", "type": "function_call", "status": "completed",
            "call_id": call_id, "name": tool.name, "arguments": args}
        return item | ({"namespace": tool.namespace} if tool.namespace else {})
    if not steer or (steer == "once" and _any_result("responses", data, conversation)):
        return None
    for tool in (t for t in offered("responses", {"tools": data.get("tools")})
                 if not t.custom and t.namespace is None):
        return {"id": f"fc_{item_id}", "type": "function_call", "status": "completed",
                "call_id": call_id, "name": tool.name,
                "arguments": headers.get("x-fake-tool-args", '{"x": 1}')}
    return None


def anthropic_tool_use(data: Any, headers: dict[str, str]) -> dict[str, Any] | None:
    """The ``tool_use`` block the ``x-fake-tool`` header asks for (any value but ``agent``:
    the first custom tool with ``{"x": 1}``, every time), else None."""
    if "x-fake-tool" not in headers:
        return None
    block_id = f"toolu_fake{uuid.uuid4().hex[:20]}"
    if _steer(headers) == "agent":
        call = _agent_call("anthropic", data, headers)
        return None if call is None else {"type": "tool_use", "id": block_id,
                                          "name": call[0].name, "input": orjson.loads(call[1])}
    tools = offered("anthropic", data)
    return {"type": "tool_use", "id": block_id, "name": tools[0].name, "input": {"x": 1}} \
        if tools else None
