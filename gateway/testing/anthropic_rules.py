"""What the fake Anthropic upstream (:mod:`gateway.testing.fake_anthropic`) accepts: the
Messages API's own checks, as strict as the real API (https://docs.anthropic.com/en/api/messages,
/errors), so that a translator bug fails loudly, a 400 naming the field, pydantic-style.

:func:`check_headers` (a key, ``anthropic-version``) and :func:`validate_request` (fields,
types, ranges, blocks by type and role, ``tool_use``/``tool_result`` pairing, tools, at most 4
cache breakpoints, and where a mid-conversation system message may sit: after a user turn, or
an assistant turn ending in a server tool's use, and then last or before an assistant turn,
never first, never two in a row; https://platform.claude.com/docs/en/build-with-claude/
mid-conversation-system-messages). A model that takes no system-role message at all answers
as older Claude models do (:func:`refuse_system_role`).
"""

from __future__ import annotations

import re
from functools import partial
from typing import Any

__all__ = ["ApiError", "check_headers", "refuse_system_role", "validate_request"]

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
                403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                429: "rate_limit_error", 504: "timeout_error", 529: "overloaded_error"}
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")

# Shapes, from the SDK's request types: key -> type, tuple of types or frozenset of strings;
# "key?": optional (null too); "*": any other key, else "Extra inputs are not permitted".
Spec = dict[str, Any]
_CC = "cache_control?"
_COUNT: Spec = {"model": str, "messages": list, _CC: dict, "output_config?": dict, "speed?": str,
                "system?": (str, list), "thinking?": dict, "tool_choice?": dict, "tools?": list,
                "user_profile_id?": str, "workspace_id?": str,
                "context_management?": dict}  # (context-management-2025-06-27 beta)
_CREATE: Spec = {**_COUNT, "max_tokens": int, "container?": object, "diagnostics?": dict,
                 "inference_geo?": str, "metadata?": dict, "stop_sequences?": list,
                 "service_tier?": frozenset({"auto", "standard_only"}), "stream?": bool,
                 "temperature?": float, "top_k?": int, "top_p?": float}
_RANGES = {"max_tokens": (0, None), "temperature": (0, 1), "top_p": (0, 1), "top_k": (0, None)}
_CUSTOM_TOOL: Spec = {"name": str, "input_schema": dict, "type?": str, "description?": str,
                      _CC: dict, "strict?": bool, "allowed_callers?": list, "defer_loading?": bool,
                      "eager_input_streaming?": bool, "input_examples?": list}
_SERVER_BLOCKS = ("server_tool_use", "web_search_tool_result", "web_fetch_tool_result",
                  "code_execution_tool_result", "bash_code_execution_tool_result",
                  "tool_search_tool_result", "text_editor_code_execution_tool_result")
_TOOLSET = {"toolset_name?": str, _CC: dict}
_BLOCKS: dict[str, Spec] = {
    "text": {"text": str, _CC: dict, "citations?": list},
    "image": {"source": dict, _CC: dict, "transformations?": dict},
    "document": {"source": dict, _CC: dict, "citations?": dict, "context?": str, "title?": str},
    "search_result": {"content": list, "source": str, "title": str, _CC: dict, "citations?": dict},
    "thinking": {"thinking": str, "signature": str}, "redacted_thinking": {"data": str},
    "tool_use": {"id": str, "name": str, "input": dict, "caller?": dict, **_TOOLSET},
    "tool_result": {"tool_use_id": str, "content?": (str, list), "is_error?": bool, **_TOOLSET},
    "tool_reference": {"tool_name": str, _CC: dict},  # and, loosely checked:
    **{kind: {"*": object} for kind in ("browser_state", "container_upload", *_SERVER_BLOCKS)},
}
_ASSISTANT_ONLY = {"tool_use", "thinking", "redacted_thinking", *_SERVER_BLOCKS}
_BY_ROLE = {"system": {"text"}, "user": set(_BLOCKS) - _ASSISTANT_ONLY,
            "assistant": set(_BLOCKS) - {"tool_result"}}
_INSIDE = {"tool_result": {"text", "image", "search_result", "document", "tool_reference",
                           "browser_state"}, "search_result": {"text"}}
_REF = {"url": {"url": str}, "file": {"file_id": str}}
_IMAGES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
_SOURCES: dict[str, dict[str, Spec]] = {
    "image": {"base64": {"data": str, "media_type": _IMAGES}, **_REF},
    "document": {"base64": {"data": str, "media_type": frozenset({"application/pdf"})}, **_REF,
                 "text": {"data": str, "media_type": frozenset({"text/plain"})},
                 "content": {"content": (str, list)}},
}
_PARALLEL = {"disable_parallel_tool_use?": bool}
_CHOICES: dict[str, Spec] = {"auto": _PARALLEL, "any": _PARALLEL, "none": {},
                             "tool": {"name": str, **_PARALLEL}}
_THINKING: dict[str, Spec] = {"enabled": {"budget_tokens": int, "display?": str},
                              "adaptive": {"display?": str}, "disabled": {}}
_CACHE: Spec = {"type": frozenset({"ephemeral"}), "ttl?": frozenset({"5m", "1h"})}
_TYPE_NAMES = {str: "a valid string", dict: "a valid dictionary", list: "a valid list",
               bool: "a valid boolean", int: "a valid integer", float: "a valid number"}


class ApiError(Exception):
    """An Anthropic error answer: HTTP ``status``, ``error.type`` and ``error.message``."""

    def __init__(self, status: int, message: str, retry_after: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.retry_after = status, message, retry_after
        self.type = _ERROR_TYPES.get(status, "api_error")

    def body(self, request_id: str) -> dict[str, Any]:
        return {"type": "error", "error": {"type": self.type, "message": self.message},
                "request_id": request_id}


_bad = partial(ApiError, 400)  # an invalid_request_error


def check_headers(headers: dict[str, str], api_key: str | None = None) -> None:
    """Raises :class:`ApiError` 401 without a key (``x-api-key`` or ``authorization: Bearer``)
    or, when ``api_key`` is set, with another one; 400 without ``anthropic-version``."""
    key = headers.get("x-api-key") or headers.get("authorization", "").removeprefix("Bearer ")
    if not key:
        raise ApiError(401, "x-api-key header is required")
    if api_key is not None and key != api_key:
        raise ApiError(401, "invalid x-api-key")
    if not headers.get("anthropic-version"):
        raise _bad("anthropic-version: header is required")


def validate_request(data: Any, *, count_tokens: bool = False) -> None:
    """Checks a Messages (``count_tokens``: count_tokens) body as the real API does; raises
    :class:`ApiError` 400 naming the field, pydantic-style: fields, types, ranges, blocks by type
    and role, ``tool_use``/``tool_result`` pairing across turns (same-role messages merge, as
    documented), tools, at most 4 cache breakpoints. ``max_tokens`` may be 0 (SDK 2.12 docs)."""
    marks: list[str] = []  # where the cache_control breakpoints are
    _shape(data, "", _COUNT if count_tokens else _CREATE, marks)  # top-level: automatic caching
    for name, (low, high) in _RANGES.items():
        if (value := data.get(name)) is not None and not low <= value <= (high or value):
            raise _bad(f"{name}: Input should be >= {low}" + (f" and <= {high}" if high else ""))
    for i, seq in enumerate(data.get("stop_sequences") or ()):
        _shape({"s": seq}, f"stop_sequences.{i}", {"s": str})
    if data.get("thinking") is not None:
        _tagged(data["thinking"], "thinking", _THINKING)
    for j, block in enumerate(data["system"] if isinstance(data.get("system"), list) else ()):
        _block(block, f"system.{j}", _BY_ROLE["system"], marks)
    names = _tools(data.get("tools") or [], marks)
    if data.get("tool_choice") is not None:
        choice = _tagged(data["tool_choice"], "tool_choice", _CHOICES)
        called = choice.get("name", names[0] if names else None)
        if choice["type"] in ("any", "tool") and called not in names:
            raise _bad(f"tool_choice: {choice['type']!r} needs the tool in `tools`")
    _messages(data["messages"], marks)
    if len(marks) > 4:
        raise _bad(f"A maximum of 4 blocks with cache_control may be provided. "
                   f"Found {len(marks)}.")


def _shape(obj: Any, path: str, spec: Spec, marks: list[str] | None = None) -> dict[str, Any]:
    """Checks ``obj`` against ``spec``; returns it. ``marks``: where cache breakpoints are."""
    if not isinstance(obj, dict):
        raise _bad(f"{path or 'body'}: Input should be a valid dictionary")
    for key in [*(k for k in spec if k[-1] not in "?*" and k not in obj), *obj]:
        at = f"{path}.{key}".lstrip(".")
        if key not in obj:
            raise _bad(f"{at}: Field required")
        want, value = spec.get(key, spec.get(key + "?", spec.get("*"))), obj[key]
        if want is None:
            raise _bad(f"{at}: Extra inputs are not permitted")
        wants = want if isinstance(want, tuple) else (want,)
        if (value is None and key not in spec) or object in wants:
            continue  # null is fine for an optional field
        if isinstance(want, frozenset) and not (isinstance(value, str) and value in want):
            raise _bad(f"{at}: Input should be {' or '.join(map(repr, sorted(want)))}")
        if not isinstance(want, frozenset) and not any(
                isinstance(value, (int, float) if w is float else w)
                and (w is bool or not isinstance(value, bool)) for w in wants):
            raise _bad(f"{at}: Input should be {' or '.join(_TYPE_NAMES[w] for w in wants)}")
    if marks is not None and obj.get("cache_control") is not None:
        _shape(obj["cache_control"], f"{path}.cache_control".lstrip("."), _CACHE)
        marks.append(path)
    return obj


def _tagged(obj: Any, path: str, table: dict[str, Spec],
            marks: list[str] | None = None) -> dict[str, Any]:
    kind = obj.get("type") if isinstance(obj, dict) else None
    if not isinstance(kind, str) or kind not in table:
        raise _bad(f"{path}: Input tag {kind!r} found using 'type' does not match any of the "
                   f"expected tags: {', '.join(map(repr, table))}")
    return _shape(obj, path, {"type": str, **table[kind]}, marks)


def _tools(tools: list[Any], marks: list[str]) -> list[str]:
    names: list[str] = []
    for i, tool in enumerate(tools):
        path = f"tools.{i}"
        if isinstance(tool, dict) and tool.get("type") not in (None, "custom"):  # server tools
            _shape(tool, path, {"type": str, "name": str, "*": object}, marks)
        elif _shape(tool, path, _CUSTOM_TOOL, marks)["input_schema"].get("type") != "object":
            raise _bad(f"{path}.input_schema.type: Input should be 'object'")
        if not _TOOL_NAME.fullmatch(tool["name"]):
            raise _bad(f"{path}.name: String should match pattern '{_TOOL_NAME.pattern}'")
        if tool["name"] in names:
            raise _bad("tools: Tool names must be unique.")
        names.append(tool["name"])
    return names


def _messages(messages: list[Any], marks: list[str]) -> None:
    if not messages:
        raise _bad("messages: at least one message is required")
    turns: list[tuple[str, int, list[dict[str, Any]]]] = []  # (role, first index, blocks)
    for i, message in enumerate(messages):
        path = f"messages.{i}"
        spec = {"role": frozenset(_BY_ROLE), "content": (str, list)}
        role, content = _shape(message, path, spec)["role"], message["content"]
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        for j, block in enumerate(content if isinstance(content, list) else ()):
            _block(block, f"{path}.content.{j}", _BY_ROLE[role], marks)
        if not content and not (i == len(messages) - 1 and role == "assistant"):
            raise _bad(f"{path}: all messages must have non-empty content except for the "
                       "optional final assistant message")
        kinds = [block["type"] for block in blocks]
        if "tool_result" in kinds[kinds.count("tool_result"):]:
            raise _bad(f"{path}.content: tool_result blocks must come first in a user message")
        if turns and turns[-1][0] == role:
            turns[-1][2].extend(blocks)
        else:
            turns.append((role, i, list(blocks)))
    pending: list[str] = []  # tool_use ids of the previous turn, awaiting their results
    at = 0
    for _, i, blocks in [*turns, ("end", len(messages), [])]:
        results = [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"]
        if orphans := [r for r in results if r not in pending]:
            raise _bad(f"messages.{i}: unexpected `tool_use_id` found in `tool_result` blocks: "
                       f"{', '.join(orphans)}. Each `tool_result` block must have a "
                       "corresponding `tool_use` block in the previous message.")
        if missing := [p for p in pending if p not in results]:
            raise _bad(f"messages.{at}: `tool_use` ids were found without `tool_result` blocks "
                       f"immediately after: {', '.join(missing)}. Each `tool_use` block must "
                       "have a corresponding `tool_result` block in the next message.")
        pending, at = [b["id"] for b in blocks if b["type"] == "tool_use"], i
    for i, message in enumerate(messages):
        if message["role"] == "system":
            _placed(messages, i)


def _placed(messages: list[dict[str, Any]], i: int) -> None:
    """Where a mid-conversation system message may sit (Anthropic's placement rules)."""
    before = messages[i - 1] if i else None
    after = messages[i + 1] if i + 1 < len(messages) else None
    if before is None:
        raise _bad("messages.0: a system message cannot be the first message; the system "
                   "prompt goes in the top-level `system` field")
    last = before["content"][-1:] if isinstance(before["content"], list) else []
    if before["role"] != "user" and not (before["role"] == "assistant" and last
                                         and last[0]["type"] == "server_tool_use"):
        raise _bad(f"messages.{i}: a system message must immediately follow a user message "
                   "(or an assistant message ending in a server tool use)")
    if after is not None and after["role"] != "assistant":
        raise _bad(f"messages.{i}: a system message must be the last message or be followed "
                   "by an assistant message")


def refuse_system_role(data: dict[str, Any]) -> None:
    """As a model without mid-conversation system messages (those before Claude Opus 4.8):
    :class:`ApiError` 400 for the first system-role message in ``messages``."""
    for i, message in enumerate(data["messages"]):
        if message["role"] == "system":
            raise _bad(f"messages.{i}.role: role 'system' is not supported on this model")


def _block(block: Any, path: str, allowed: set[str], marks: list[str]) -> None:
    kind = _tagged(block, path, _BLOCKS, marks)["type"]
    if kind not in allowed:
        raise _bad(f"{path}: `{kind}` blocks are not allowed here")
    if kind == "text" and not block["text"].strip():
        raise _bad(f"{path}.text: text content blocks must contain non-whitespace text")
    if kind in _SOURCES:
        _tagged(block["source"], f"{path}.source", _SOURCES[kind])
    inner = block.get("content") if kind in _INSIDE else None
    for j, item in enumerate(inner if isinstance(inner, list) else ()):
        _block(item, f"{path}.content.{j}", _INSIDE[kind], marks)
