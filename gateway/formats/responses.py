"""The OpenAI Responses wire format (``/v1/responses``): requests in, answers and errors out.
Pure, no I/O.

- :func:`parse_request`: a request body checked at the door: ``model``; ``input`` a string
  or an array of items (messages with text and image parts, ``function_call``,
  ``function_call_output``, ``custom_tool_call``, ``custom_tool_call_output``, reasoning
  items, ``additional_tools`` items with their array of tools); ``instructions``;
  ``tools`` (each an object with a ``type``);
  ``max_output_tokens``; ``stream``. Other fields pass through to a native upstream.
- :func:`input_messages`: the input as Chat Completions messages (``instructions`` first as
  the system message), the view the cache keys, the router and the chat translation read.
- :func:`answer_from_response` / :func:`response_body`: the format-neutral
  :class:`~gateway.formats.answer.Answer` of a ``response`` object, and an answer rendered
  as one (a cache hit, or a translated answer).
- Errors are OpenAI's shape (``{"error": {...}}``), as on the other OpenAI endpoints.

Wire format: https://platform.openai.com/docs/api-reference/responses
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from gateway.errors import InvalidRequest
from gateway.formats.answer import Answer
from gateway.formats.checks import (
    a_string,
    invalid_type,
    invalid_value,
    load_request,
    missing,
    shown,
)
from gateway.formats.ids import random_hex
from gateway.formats.responses_tools import HOSTED_TOOLS, ToolNames, call_item, declared_tools

__all__ = ["HOSTED_TOOLS", "answer_from_response", "chat_view", "input_messages",
           "parse_request", "response_body", "response_finish_reason", "response_object"]

_ITEM_TYPES = frozenset({"message", "function_call", "function_call_output", "reasoning",
                         "custom_tool_call", "custom_tool_call_output", "additional_tools"})
#: The items that answer or make a call: each names it by its ``call_id``.
_CALL_ITEMS = frozenset({"function_call", "function_call_output", "custom_tool_call",
                         "custom_tool_call_output"})
#: Output items of a tool call, in a ``response`` object.
_CALLS = ("function_call", "custom_tool_call")
_ROLES = frozenset({"user", "assistant", "system", "developer"})


def parse_request(raw: bytes) -> dict[str, Any]:
    """The request as a dict; raises InvalidJSON or InvalidRequest (400) naming the field."""
    data = load_request(raw)
    if "input" not in data:
        raise missing("input")
    items = data["input"]
    if not isinstance(items, (str, list)):
        raise invalid_type("input", "a string or an array of items", items)
    if isinstance(items, list):
        for i, item in enumerate(items):
            _check_item(item, f"input[{i}]")
    instructions = data.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise invalid_type("instructions", "a string", instructions)
    tools = data.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise invalid_type("tools", "an array", tools)
        for i, tool in enumerate(tools):
            if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
                raise invalid_type(f"tools[{i}]", "a tool object with a 'type'", tool)
            if tool["type"] == "function" and not isinstance(tool.get("name"), str):
                raise missing(f"tools[{i}].name")
    limit = data.get("max_output_tokens")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)
                              or limit < 1):
        raise invalid_value("max_output_tokens", "'max_output_tokens' must be an integer "
                            f">= 1, got {orjson.dumps(limit).decode()[:40]}")
    for flag in ("stream", "store"):
        if data.get(flag) is not None and not isinstance(data[flag], bool):
            raise invalid_type(flag, "a boolean", data[flag])
    if data.get("background"):  # polled and cancelled upstream: not through a gateway
        raise InvalidRequest("'background' responses are not served by this gateway",
                             param="background", code="unsupported_parameter")
    previous = data.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise invalid_type("previous_response_id", "a string", previous)
    return data


def _check_item(item: Any, where: str) -> None:
    if not isinstance(item, dict):
        raise invalid_type(where, "an object", item)
    kind = item.get("type", "message")
    if not isinstance(kind, str):
        raise invalid_type(f"{where}.type", "a string", kind)
    if kind not in _ITEM_TYPES:
        raise invalid_value(f"{where}.type", f"unknown input item type {kind!r}")
    if kind == "message":
        role = item.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise invalid_value(f"{where}.role", "'role' must be one of user, assistant, "
                                f"system, developer, got {shown(role)}")
        if not isinstance(item.get("content"), (str, list)):
            raise invalid_type(f"{where}.content", "a string or an array of parts",
                               item.get("content"))
    elif kind in _CALL_ITEMS and not isinstance(item.get("call_id"), str):
        raise missing(f"{where}.call_id")
    elif kind == "additional_tools" and not isinstance(item.get("tools"), list):
        raise invalid_type(f"{where}.tools", "an array of tools", item.get("tools"))


def _part(part: Any, where: str, strict: bool) -> Any:
    """One content part as a Chat Completions part (not ``strict``: a part that has none
    kept as it came)."""
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in ("input_text", "output_text", "text"):
        text = part.get("text", "")
        if isinstance(text, str) or not strict:
            return {"type": "text", "text": text}
        raise invalid_type(f"{where}.text", "a string", text)
    if kind == "input_image" and isinstance(part.get("image_url"), str):
        image: dict[str, Any] = {"url": part["image_url"]}
        if part.get("detail"):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    if not strict:
        return part
    if kind == "input_image":
        raise InvalidRequest("an input_image needs an 'image_url' (a file_id cannot be "
                             "served by this upstream)", param=where)
    raise InvalidRequest(f"content part type {shown(kind)} cannot be served by this upstream",
                         param=where, code="unsupported_content")


def _content(content: Any, where: str, strict: bool) -> Any:
    if isinstance(content, str):
        return content
    parts = [_part(p, f"{where}[{i}]", strict) for i, p in enumerate(content)]
    if all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p["text"], str)
           for p in parts):
        return "".join(p["text"] for p in parts)  # plain text, as most servers expect
    return parts


def _output(output: Any) -> str:
    """A call's output as a tool message's text: a string as it is, an array of text parts
    their texts, anything else its JSON."""
    if isinstance(output, str):
        return output
    if isinstance(output, list) and output and all(
            isinstance(p, dict) and p.get("type") in ("input_text", "output_text")
            and isinstance(p.get("text"), str) for p in output):
        return "".join(p["text"] for p in output)
    return orjson.dumps(output).decode()


def _call(item: dict[str, Any], where: str, strict: bool, names: ToolNames
          ) -> dict[str, Any]:
    """A ``function_call`` or ``custom_tool_call`` item as a chat tool call, named as the
    upstream is offered its tool (a custom tool's text as ``{"input": ...}``)."""
    name, namespace = item.get("name", ""), item.get("namespace")
    if item["type"] == "custom_tool_call":
        text = item.get("input", "")
        if strict:
            a_string(text, f"{where}.input")
        arguments: Any = orjson.dumps({"input": text}).decode() if isinstance(text, str) \
            else text
    else:
        arguments = item.get("arguments", "")
        if strict:
            a_string(arguments, f"{where}.arguments")
    if strict:
        a_string(name, f"{where}.name")
        if namespace is not None:
            a_string(namespace, f"{where}.namespace")
    if isinstance(name, str):
        name = names.flat(name, namespace if isinstance(namespace, str) else None)
    return {"id": item["call_id"], "type": "function", "function": {
        "name": name, "arguments": arguments}}


def input_messages(body: dict[str, Any], strict: bool = True,
                   names: ToolNames | None = None) -> list[dict[str, Any]]:
    """``instructions`` and ``input`` as Chat Completions messages: consecutive
    ``function_call`` and ``custom_tool_call`` items become one assistant message's
    ``tool_calls`` (named as ``names``, made of the request's tools when None, offers them:
    :class:`~gateway.formats.responses_tools.ToolNames`); a ``function_call_output`` or
    ``custom_tool_call_output`` a ``tool`` message; reasoning items are left out (no chat
    counterpart). ``strict`` (a translation): raises InvalidRequest (400) naming the field
    for a part the chat format cannot carry, or a call's name, arguments, input or
    namespace that are not strings; else (a view of the request: :func:`chat_view`) such a
    part is kept as it came."""
    out: list[dict[str, Any]] = []
    if body.get("instructions"):
        out.append({"role": "system", "content": body["instructions"]})
    items = body["input"]
    if isinstance(items, str):
        return [*out, {"role": "user", "content": items}]
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            out.append({"role": role, "content": _content(item["content"],
                                                          f"input[{i}].content", strict)})
        elif kind in _CALLS:
            if names is None:
                names = ToolNames(declared_tools(body))
            call = _call(item, f"input[{i}]", strict, names)
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            out.append({"role": "tool", "tool_call_id": item["call_id"],
                        "content": _output(item.get("output", ""))})
    return out


def chat_view(body: dict[str, Any]) -> dict[str, Any]:
    """The request as an OpenAI-chat-shaped dict (``messages``; the sampling and output
    fields under their chat names) for cache keys and router features."""
    view = {k: v for k, v in body.items() if k not in ("input", "instructions")}
    view["messages"] = input_messages(body, strict=False)
    declared = declared_tools(body)
    if len(declared) > len(view.get("tools") or ()):  # some in additional_tools items
        view["tools"] = declared
    if "max_output_tokens" in view:
        view["max_completion_tokens"] = view.pop("max_output_tokens")
    return view


def answer_from_response(obj: Any, allow_tools: bool) -> Answer | None:
    """The cacheable answer of a ``response`` object (parsed), or None: not completed, tool
    calls when not ``allow_tools``, or a call of a custom or namespaced tool (an
    :class:`~gateway.formats.answer.Answer` names a function alone)."""
    if not isinstance(obj, dict) or obj.get("status") != "completed":
        return None
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in obj.get("output") or []:
        if not isinstance(item, dict):
            return None
        if item.get("type") == "message":
            texts += [p.get("text", "") for p in item.get("content") or []
                      if isinstance(p, dict) and p.get("type") == "output_text"]
        elif item.get("type") == "custom_tool_call" or item.get("namespace") is not None:
            return None  # a call the chat answer cannot name: not kept
        elif item.get("type") == "function_call":
            calls.append({"id": item.get("call_id"), "type": "function", "function": {
                "name": item.get("name"), "arguments": item.get("arguments", "")}})
    usage = obj.get("usage") or {}
    return Answer.complete("".join(texts) if texts else None,
                           "tool_calls" if calls else "stop", obj.get("model", ""), calls,
                           {"prompt_tokens": usage.get("input_tokens"),
                            "completion_tokens": usage.get("output_tokens")}, allow_tools)


def response_object(answer: Answer, id_: str | None = None, *,
                    status: str = "completed", body: dict[str, Any] | None = None
                    ) -> dict[str, Any]:
    """``answer`` as a ``response`` object: a message item with its text, then a
    ``function_call`` item per tool call (a ``custom_tool_call`` for a custom tool, named
    as ``body``'s tools declare it: :func:`~gateway.formats.responses_tools.call_item`);
    usage in input/output tokens. ``body``: the request, whose settings the object echoes
    (instructions, tools, metadata, ...)."""
    rid = id_ or "resp_" + random_hex()
    output: list[dict[str, Any]] = []
    if answer.content is not None:
        output.append({"type": "message", "id": "msg_" + random_hex(),
                       "status": "completed", "role": "assistant",
                       "content": [{"type": "output_text", "text": answer.content,
                                    "annotations": []}]})
    if answer.tool_calls:
        names = ToolNames(declared_tools(body)) if body else None
        output += [call_item(call, names) for call in answer.tool_calls]
    prompt, completion = answer.prompt_tokens or 0, answer.completion_tokens or 0
    req = body or {}
    return {
        "id": rid, "object": "response", "created_at": int(time.time()), "status": status,
        "error": None, "incomplete_details": ({"reason": "content_filter" if answer.finish_reason
                                               == "content_filter" else "max_output_tokens"}
                                              if status == "incomplete" else None),
        "instructions": req.get("instructions"), "model": answer.model,
        "output": output, "parallel_tool_calls": req.get("parallel_tool_calls", True),
        "previous_response_id": req.get("previous_response_id"),
        "max_output_tokens": req.get("max_output_tokens"),
        "temperature": req.get("temperature"), "top_p": req.get("top_p"),
        "tool_choice": req.get("tool_choice", "auto"), "tools": req.get("tools", []),
        "text": req.get("text", {"format": {"type": "text"}}),
        "metadata": req.get("metadata", {}), "store": req.get("store", True),
        "usage": {"input_tokens": prompt,
                  "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                  "output_tokens": completion,
                  "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": prompt + completion},
    }


def response_body(answer: Answer, id_: str | None = None) -> bytes:
    """:func:`response_object` as JSON bytes."""
    return orjson.dumps(response_object(answer, id_))


def response_finish_reason(obj: dict[str, Any]) -> str | None:
    """A ``response`` object's end in chat's words: ``length`` (incomplete at its token
    limit), ``tool_calls`` (a function or custom tool call in its output), ``stop``; None
    when not done."""
    status = obj.get("status")
    if status == "incomplete":
        return "length"
    if status != "completed":
        return None
    output = obj.get("output")
    calls = isinstance(output, list) and any(
        isinstance(item, dict) and item.get("type") in _CALLS for item in output)
    return "tool_calls" if calls else "stop"
