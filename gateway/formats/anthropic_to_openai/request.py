"""An Anthropic client calling an OpenAI-compatible upstream (a hosted API, vLLM, SGLang,
the local engine): its Messages request becomes a Chat Completions request. Pure, no I/O.

    openai_request(body, model) -> the Chat Completions request (a dict)

Request, Anthropic -> OpenAI (a field with no equivalent raises :class:`InvalidRequest`, 400,
``param`` naming it, the message naming the feature; so does any field not listed here, and
a field read here of a shape it cannot be, through :mod:`gateway.formats.checks`' readers:
the door checks only what the gateway itself reads)::

    system (string | text blocks)     a first system message, blocks joined with "\\n\\n"
    messages[] role "system"          a system message in place
    text block                        text; the content is a plain string when it is text only
    image block (base64 | url)        image_url part (a data: URL | the URL); file source: 400
    document block, base64 PDF        file part {file_data: data URL, filename "document.pdf"}
    document block, text | content    text (title, context, citations dropped); url/file: 400
    tool_use (assistant)              tool_calls[] (arguments = the input as JSON)
    tool_result (user)                a "tool" message each, before the rest of that message;
                                      text blocks joined; is_error: content "Error: " + text;
                                      images or documents inside: 400
    thinking, redacted_thinking       dropped (no equivalent; the turn reads the same without)
    a final assistant message         400: prefill has no equivalent (a new turn would come)
    cache_control (anywhere)          dropped: OpenAI-compatible servers cache prefixes alone
    max_tokens                        max_tokens (not max_completion_tokens: vLLM, SGLang and
                                      the local engine accept it)
    temperature, top_p                same
    top_k                             top_k (a vLLM / SGLang extension; OpenAI itself lacks it)
    stop_sequences                    stop
    metadata.user_id                  user
    stream                            stream, with stream_options {"include_usage": true}
    tools[] (no type | "custom")      function tools (parameters = input_schema, strict kept);
                                      server tools (web_search_..., bash_...): 400
    tool_choice auto|any|none|tool    "auto"|"required"|"none"|{"type": "function", ...}
    disable_parallel_tool_use: true   parallel_tool_calls: false
    output_config.format json_schema  response_format json_schema (name "output", strict)
    thinking (an object), output_config.effort, context_management
                                      dropped: how much Claude thinks, and shows, and how
                                      its server trims a long context; an OpenAI-compatible
                                      model answers the same conversation without them (no
                                      thinking block comes back, as a Claude answer may have
                                      none). Claude Code sends all three by default.
    container, mcp_servers,
    inference_geo (but "global")      400
    service_tier, speed, diagnostics,
    top-level cache_control           dropped (they do not change the answer)

Sources: https://docs.anthropic.com/en/api/messages,
https://platform.openai.com/docs/api-reference/chat, https://docs.anthropic.com/en/api/errors
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.errors import InvalidRequest
from gateway.formats.checks import a_string, an_array, an_object, invalid_type, required

__all__ = ["openai_request"]

_UPSTREAM = "an OpenAI-compatible upstream"
_JOIN = "\n\n"  # between the text blocks of one system prompt, message or tool result
_DROPPED = frozenset({"model", "service_tier", "speed", "diagnostics", "cache_control",
                      "context_management"})
_MAPPED = frozenset({"max_tokens", "messages", "system", "temperature", "top_p", "top_k",
                     "stop_sequences", "metadata", "stream", "tools", "tool_choice",
                     "thinking", "output_config", "container", "mcp_servers", "inference_geo"})
_TOOL_KEYS = frozenset({"type", "name", "description", "input_schema", "strict",
                        "cache_control", "eager_input_streaming"})


def _unsupported(feature: str, param: str, code: str = "unsupported_parameter",
                 hint: str = "") -> InvalidRequest:
    return InvalidRequest(f"{feature} is not supported when the model is served by "
                          f"{_UPSTREAM}{hint}", param=param, code=code)


def openai_request(body: dict[str, Any], model: str) -> dict[str, Any]:
    """The Chat Completions request for ``model`` asking what the Messages request ``body``
    (a validated dict) asks; raises InvalidRequest (400, code ``unsupported_parameter`` or
    ``unsupported_value``) for what has no equivalent (table in the module docstring)."""
    for key, value in body.items():
        if value is None or key in _DROPPED or key in _MAPPED:
            continue
        raise _unsupported(f"'{key}'", key)
    if body.get("thinking") is not None:
        an_object(body["thinking"], "thinking")  # else the 400 Anthropic would answer
    for key in ("container", "mcp_servers"):
        if body.get(key):
            raise _unsupported(f"'{key}'", key)
    if body.get("inference_geo") not in (None, "global"):
        raise _unsupported("'inference_geo'", "inference_geo", "unsupported_value")
    out: dict[str, Any] = {"model": model, "messages": _messages(body)}
    tools = [_tool(an_object(t, f"tools[{i}]"), i)
             for i, t in enumerate(an_array(body.get("tools"), "tools"))]
    if tools:
        out["tools"] = tools
        out.update(_tool_choice(body.get("tool_choice")))
    for key in ("max_tokens", "temperature", "top_p", "top_k"):
        if body.get(key) is not None:
            out[key] = body[key]
    if body.get("stop_sequences"):
        out["stop"] = list(body["stop_sequences"])
    user = (body.get("metadata") or {}).get("user_id")
    if user is not None:
        out["user"] = user
    out.update(_output_config(body.get("output_config")))
    if body.get("stream") is not None:
        out["stream"] = body["stream"]
        if body["stream"]:
            out["stream_options"] = {"include_usage": True}
    return out


def _output_config(config: Any) -> dict[str, Any]:
    if not config:
        return {}
    fmt = an_object(config, "output_config").get("format")
    if fmt is None:
        return {}
    schema = an_object(fmt, "output_config.format").get("schema")
    return {"response_format": {"type": "json_schema", "json_schema": {
        "name": "output", "schema": schema, "strict": True}}}


def _tool(tool: dict[str, Any], i: int) -> dict[str, Any]:
    kind = tool.get("type")
    if kind not in (None, "custom"):
        raise _unsupported(f"the server tool '{kind}' (tools[{i}])", f"tools[{i}]",
                           "unsupported_value")
    for key, value in tool.items():
        if key not in _TOOL_KEYS and value:
            raise _unsupported(f"'{key}' on a tool (tools[{i}])", f"tools[{i}].{key}")
    function: dict[str, Any] = {"name": a_string(tool.get("name"), f"tools[{i}].name")}
    if tool.get("description"):
        function["description"] = tool["description"]
    function["parameters"] = tool.get("input_schema") or {"type": "object", "properties": {}}
    if tool.get("strict"):
        function["strict"] = True
    return {"type": "function", "function": function}


def _tool_choice(choice: dict[str, Any] | None) -> dict[str, Any]:
    if not choice:
        return {}
    kind = choice.get("type")
    out: dict[str, Any] = {}
    if kind == "tool":
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    elif kind in ("auto", "any", "none"):
        out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
    else:
        raise _unsupported(f"tool_choice type '{kind}'", "tool_choice.type", "unsupported_value")
    if choice.get("disable_parallel_tool_use") and kind != "none":
        out["parallel_tool_calls"] = False
    return out


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        out.append({"role": "system", "content": _texts(system, "system")})
    messages = an_array(body.get("messages"), "messages")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        role, content = an_object(message, where).get("role"), message.get("content")
        if role == "system":
            out.append({"role": "system", "content": _texts(content, f"{where}.content")})
        elif role == "assistant":
            turn = _assistant(content, where)
            if turn is not None and i == len(messages) - 1:
                raise _unsupported("a final assistant message (prefill)", where,
                                   "unsupported_value", ": the upstream would answer with a "
                                   "new turn instead of continuing it")
            if turn is not None:
                out.append(turn)
        elif role == "user":
            out.extend(_user(content, where))
        else:
            raise _unsupported(f"the message role {role!r}", f"{where}.role",
                               "unsupported_value")
    return out


def _texts(content: Any, where: str) -> str:
    """The text of a string or of a list of text blocks, joined."""
    if isinstance(content, str):
        return content
    texts = []
    for j, block in enumerate(_blocks(content, where)):
        kind = block.get("type")
        if kind != "text":
            raise _unsupported(f"{_shown(kind)} blocks here ({where}[{j}])",
                               f"{where}[{j}]", "unsupported_value")
        texts.append(a_string(block.get("text"), f"{where}[{j}].text"))
    return _JOIN.join(texts)


def _shown(value: Any) -> str:
    """A client's value as a message quotes it (its repr, at most 60 characters)."""
    return repr(value)[:60]


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    """The content blocks of a string or an array of blocks (none for null); InvalidRequest
    naming ``where`` (the content's path) for any other shape."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if content is None:
        return []
    if not isinstance(content, list):
        raise invalid_type(where, "a string or an array of content blocks", content)
    blocks = content
    for j, block in enumerate(blocks):
        an_object(block, f"{where}[{j}]")
    return blocks


def _assistant(content: Any, where: str) -> dict[str, Any] | None:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(_blocks(content, f"{where}.content")):
        at = f"{where}.content[{j}]"
        kind = block.get("type")
        if kind == "text":
            if a_string(block.get("text"), f"{at}.text"):
                texts.append(block["text"])
        elif kind == "tool_use":
            calls.append({"id": a_string(block.get("id"), f"{at}.id"), "type": "function",
                          "function": {"name": a_string(block.get("name"), f"{at}.name"),
                                       "arguments": _arguments(block.get("input", {}), at)}})
        elif kind not in ("thinking", "redacted_thinking"):  # no equivalent, harmless to drop
            raise _unsupported(f"{_shown(kind)} blocks in assistant messages ({at})", at,
                               "unsupported_value")
    if not texts and not calls:
        return None
    turn: dict[str, Any] = {"role": "assistant", "content": _JOIN.join(texts) if texts else None}
    if calls:
        turn["tool_calls"] = calls
    return turn


def _user(content: Any, where: str) -> list[dict[str, Any]]:
    """The tool messages of the tool_result blocks, then a user message with the rest."""
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(_blocks(content, f"{where}.content")):
        at = f"{where}.content[{j}]"
        kind = block.get("type")
        if kind == "tool_result":
            call_id = a_string(block.get("tool_use_id"), f"{at}.tool_use_id")
            text = _tool_result_text(block.get("content"), at)
            if block.get("is_error"):  # OpenAI has no error flag: the model reads it instead
                text = f"Error: {text}" if text else "Error"
            out.append({"role": "tool", "tool_call_id": call_id, "content": text})
        elif kind == "text":
            parts.append({"type": "text", "text": a_string(block.get("text"), f"{at}.text")})
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block, at)}})
        elif kind == "document":
            parts.extend(_document(block, at))
        else:
            raise _unsupported(f"{_shown(kind)} content blocks ({at})", at, "unsupported_value")
    if parts:
        text_only = all(p["type"] == "text" for p in parts)
        out.append({"role": "user", "content": _JOIN.join(p["text"] for p in parts)
                    if text_only else parts})
    return out


def _tool_result_text(content: Any, at: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    blocks = _blocks(content, f"{at}.content")
    for k, block in enumerate(blocks):
        if block.get("type") != "text":
            raise _unsupported(f"{_shown(block.get('type'))} blocks inside a tool_result "
                               f"({at}.content[{k}])", f"{at}.content[{k}]", "unsupported_value")
    return _JOIN.join(a_string(block.get("text"), f"{at}.content[{k}].text")
                      for k, block in enumerate(blocks))


def _arguments(value: Any, at: str) -> str:
    """A tool_use block's ``input`` as a tool call's arguments: a JSON object, as text."""
    return orjson.dumps(an_object(value, f"{at}.input")).decode()


def _source(block: dict[str, Any], at: str) -> dict[str, Any]:
    return an_object(required(block, "source", f"{at}.source"), f"{at}.source")


def _image_url(block: dict[str, Any], at: str) -> str:
    source = _source(block, at)
    kind = source.get("type")
    if kind == "base64":
        media_type = a_string(source.get("media_type"), f"{at}.source.media_type")
        return f"data:{media_type};base64,{a_string(source.get('data'), f'{at}.source.data')}"
    if kind == "url":
        return a_string(source.get("url"), f"{at}.source.url")
    raise _unsupported(f"image sources of type {_shown(kind)} ({at})", f"{at}.source",
                       "unsupported_value")


def _document(block: dict[str, Any], at: str) -> list[dict[str, Any]]:
    source = _source(block, at)
    kind = source.get("type")
    if kind == "base64" and source.get("media_type") == "application/pdf":
        data = a_string(source.get("data"), f"{at}.source.data")
        return [{"type": "file", "file": {"file_data": f"data:application/pdf;base64,{data}",
                                          "filename": "document.pdf"}}]
    if kind == "text":
        return [{"type": "text", "text": a_string(source.get("data"), f"{at}.source.data")}]
    if kind == "content":
        content = required(source, "content", f"{at}.source.content")
        return [{"type": "text", "text": _texts(content, f"{at}.source.content")}]
    raise _unsupported(f"document sources of type {_shown(kind)} ({at})", f"{at}.source",
                       "unsupported_value")
