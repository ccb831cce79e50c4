"""An Anthropic client calling an OpenAI-compatible upstream (a hosted API, vLLM, SGLang,
the local engine): its Messages request becomes a Chat Completions request. Pure, no I/O.

    openai_request(body, model) -> the Chat Completions request (a dict)

Request, Anthropic -> OpenAI (a field with no equivalent raises :class:`InvalidRequest`, 400,
``param`` naming it, the message naming the feature; so does any field not listed here)::

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
    output_config.effort              400 unless "high" (the default)
    thinking                          400 unless {"type": "disabled"}
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

__all__ = ["openai_request"]

_UPSTREAM = "an OpenAI-compatible upstream"
_JOIN = "\n\n"  # between the text blocks of one system prompt, message or tool result
_DROPPED = frozenset({"model", "service_tier", "speed", "diagnostics", "cache_control"})
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
    thinking = body.get("thinking")
    if thinking is not None and thinking.get("type") != "disabled":
        raise _unsupported("extended thinking ('thinking')", "thinking", "unsupported_value",
                           " (no portable equivalent); leave it out or send "
                           '{"type": "disabled"}')
    for key in ("container", "mcp_servers"):
        if body.get(key):
            raise _unsupported(f"'{key}'", key)
    if body.get("inference_geo") not in (None, "global"):
        raise _unsupported("'inference_geo'", "inference_geo", "unsupported_value")
    out: dict[str, Any] = {"model": model, "messages": _messages(body)}
    tools = [_tool(t, i) for i, t in enumerate(body.get("tools") or ())]
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


def _output_config(config: dict[str, Any] | None) -> dict[str, Any]:
    if not config:
        return {}
    if config.get("effort") not in (None, "high"):
        raise _unsupported("'output_config.effort'", "output_config.effort",
                           "unsupported_value")
    fmt = config.get("format")
    if fmt is None:
        return {}
    return {"response_format": {"type": "json_schema", "json_schema": {
        "name": "output", "schema": fmt.get("schema"), "strict": True}}}


def _tool(tool: dict[str, Any], i: int) -> dict[str, Any]:
    kind = tool.get("type")
    if kind not in (None, "custom"):
        raise _unsupported(f"the server tool '{kind}' (tools[{i}])", f"tools[{i}]",
                           "unsupported_value")
    for key, value in tool.items():
        if key not in _TOOL_KEYS and value:
            raise _unsupported(f"'{key}' on a tool (tools[{i}])", f"tools[{i}].{key}")
    function: dict[str, Any] = {"name": tool["name"]}
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
    messages = body.get("messages") or []
    for i, message in enumerate(messages):
        role, content, where = message.get("role"), message.get("content"), f"messages[{i}]"
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
    for j, block in enumerate(content or ()):
        if block.get("type") != "text":
            raise _unsupported(f"'{block.get('type')}' blocks here ({where}[{j}])",
                               f"{where}[{j}]", "unsupported_value")
        texts.append(block["text"])
    return _JOIN.join(texts)


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content or ())


def _assistant(content: Any, where: str) -> dict[str, Any] | None:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(_blocks(content)):
        kind = block.get("type")
        if kind == "text":
            if block["text"]:
                texts.append(block["text"])
        elif kind == "tool_use":
            calls.append({"id": block["id"], "type": "function", "function": {
                "name": block["name"], "arguments": orjson.dumps(block.get("input", {})).decode()}})
        elif kind not in ("thinking", "redacted_thinking"):  # no equivalent, harmless to drop
            raise _unsupported(f"'{kind}' blocks in assistant messages ({where}.content[{j}])",
                               f"{where}.content[{j}]", "unsupported_value")
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
    for j, block in enumerate(_blocks(content)):
        at = f"{where}.content[{j}]"
        kind = block.get("type")
        if kind == "tool_result":
            text = _tool_result_text(block.get("content"), at)
            if block.get("is_error"):  # OpenAI has no error flag: the model reads it instead
                text = f"Error: {text}" if text else "Error"
            out.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": text})
        elif kind == "text":
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block, at)}})
        elif kind == "document":
            parts.extend(_document(block, at))
        else:
            raise _unsupported(f"'{kind}' content blocks ({at})", at, "unsupported_value")
    if parts:
        text_only = all(p["type"] == "text" for p in parts)
        out.append({"role": "user", "content": _JOIN.join(p["text"] for p in parts)
                    if text_only else parts})
    return out


def _tool_result_text(content: Any, at: str) -> str:
    if isinstance(content, str) or not content:
        return content or ""
    for k, block in enumerate(content):
        if block.get("type") != "text":
            raise _unsupported(f"'{block.get('type')}' blocks inside a tool_result "
                               f"({at}.content[{k}])", f"{at}.content[{k}]", "unsupported_value")
    return _JOIN.join(block["text"] for block in content)


def _image_url(block: dict[str, Any], at: str) -> str:
    source = block.get("source") or {}
    if source.get("type") == "base64":
        return f"data:{source['media_type']};base64,{source['data']}"
    if source.get("type") == "url":
        return str(source["url"])
    raise _unsupported(f"image sources of type '{source.get('type')}' ({at})",
                       f"{at}.source", "unsupported_value")


def _document(block: dict[str, Any], at: str) -> list[dict[str, Any]]:
    source = block.get("source") or {}
    kind = source.get("type")
    if kind == "base64" and source.get("media_type") == "application/pdf":
        return [{"type": "file", "file": {
            "file_data": f"data:application/pdf;base64,{source['data']}",
            "filename": "document.pdf"}}]
    if kind == "text":
        return [{"type": "text", "text": source["data"]}]
    if kind == "content":
        return [{"type": "text", "text": _texts(source["content"], f"{at}.source.content")}]
    raise _unsupported(f"document sources of type '{kind}' ({at})", f"{at}.source",
                       "unsupported_value")
