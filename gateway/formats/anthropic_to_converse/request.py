"""An Anthropic Messages request as a Converse request (gateway.formats.converse). Pure.

What maps: ``system`` (a string or text blocks) -> ``system`` text blocks; each message's
blocks: ``text``, ``image`` (base64) -> ``image`` bytes, ``document`` (base64 PDF, or
plain text) -> ``document``, ``tool_use`` -> ``toolUse``, ``tool_result`` ->
``toolResult`` (``status: error`` for ``is_error``), ``thinking`` / ``redacted_thinking``
-> ``reasoningContent``; every ``cache_control`` -> a ``cachePoint`` after its block (in
``system``, ``messages`` and ``tools`` alike); ``max_tokens``, ``temperature``, ``top_p``,
``stop_sequences`` -> ``inferenceConfig``; custom tools -> ``toolSpec``; ``tool_choice``
``auto``/``any``/``tool`` -> the same (``none``: no choice sent, the tools kept for the
conversation's calls); ``top_k`` and, for a Claude model, ``thinking`` ->
``additionalModelRequestFields``; ``output_config.format`` (a JSON schema) -> the forced
:data:`~gateway.formats.converse.JSON_TOOL`.

Dropped, as for an OpenAI-compatible model (they steer how Claude works, or are the
first-party API's own): ``metadata``, ``service_tier``, ``output_config.effort``,
``context_management``, ``disable_parallel_tool_use``, ``thinking`` for a model that is
not Claude. Refused (400 naming it): an image or document by URL or file id, server tools
(``web_search``...), a system-role message inside ``messages``, a structured output with
tools beside it, tool calls or results in ``messages`` with no ``tools`` (Converse needs
them declared), ``container`` and ``mcp_servers``.
"""

from __future__ import annotations

import base64
from typing import Any

from gateway.errors import InvalidRequest
from gateway.formats.converse import CACHE_POINT, JSON_TOOL

__all__ = ["converse_request"]

_REFUSED = ("container", "mcp_servers")
_IMAGE_FORMATS = {"image/png": "png", "image/jpeg": "jpeg", "image/gif": "gif",
                  "image/webp": "webp"}


def _bad(message: str, code: str = "unsupported_parameter") -> InvalidRequest:
    return InvalidRequest(f"{message} (this model is served through Amazon Bedrock's "
                          "Converse API)", code=code)


def _text_blocks(value: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"text": value}] if value else []
    out: list[dict[str, Any]] = []
    for block in value or ():
        if not isinstance(block, dict) or block.get("type") != "text":
            raise _bad(f"{where}: only text blocks can be sent")
        out.append({"text": block.get("text", "")})
        if block.get("cache_control"):
            out.append(dict(CACHE_POINT))
    return out


def _source(block: dict[str, Any], kind: str) -> tuple[str, str]:
    """(media type, base64 data) of an image or document block; 400 for a URL or file."""
    source = block.get("source")
    if not isinstance(source, dict):
        raise _bad(f"{kind} without a source")
    if source.get("type") == "base64":
        return str(source.get("media_type", "")), str(source.get("data", ""))
    if source.get("type") == "text" and kind == "document":
        return "text/plain", base64.b64encode(str(source.get("data", "")).encode()).decode()
    raise _bad(f"{kind} source {source.get('type')!r}: only base64 data can be sent")


def _result_content(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"text": content}]
    out: list[dict[str, Any]] = []
    for block in content or ():
        if isinstance(block, dict) and block.get("type") == "image":
            out.append(_block(block, 0)[0])
        elif isinstance(block, dict) and block.get("type") == "text":
            out.append({"text": block.get("text", "")})
    return out or [{"text": ""}]


def _block(block: Any, n: int) -> list[dict[str, Any]]:
    """One content block as Converse's (and its cachePoint); ``n``: its document number."""
    if isinstance(block, str):
        return [{"text": block}]
    if not isinstance(block, dict):
        raise _bad("a content block that is not an object", "invalid_value")
    kind = block.get("type")
    if kind == "text":
        out = [{"text": block.get("text", "")}]
    elif kind == "image":
        media, data = _source(block, "image")
        if media not in _IMAGE_FORMATS:
            raise _bad(f"image media_type {media!r}")
        out = [{"image": {"format": _IMAGE_FORMATS[media], "source": {"bytes": data}}}]
    elif kind == "document":
        media, data = _source(block, "document")
        fmt = {"application/pdf": "pdf", "text/plain": "txt"}.get(media)
        if fmt is None:
            raise _bad(f"document media_type {media!r}")
        out = [{"document": {"format": fmt, "name": f"document-{n}",
                             "source": {"bytes": data}}}]
    elif kind == "tool_use":
        out = [{"toolUse": {"toolUseId": block.get("id"), "name": block.get("name"),
                            "input": block.get("input") or {}}}]
    elif kind == "tool_result":
        out = [{"toolResult": {"toolUseId": block.get("tool_use_id"),
                               "content": _result_content(block.get("content")),
                               "status": "error" if block.get("is_error") else "success"}}]
    elif kind == "thinking":
        out = [{"reasoningContent": {"reasoningText": {
            "text": block.get("thinking", ""), "signature": block.get("signature", "")}}}]
    elif kind == "redacted_thinking":
        out = [{"reasoningContent": {"redactedContent": block.get("data", "")}}]
    else:
        raise _bad(f"content block type {kind!r}")
    if block.get("cache_control"):
        out.append(dict(CACHE_POINT))
    return out


def _messages(messages: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    documents = 0
    for i, message in enumerate(messages):
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise _bad(f"messages[{i}].role {role!r}: a system message inside messages")
        content = message.get("content")
        blocks: list[dict[str, Any]] = []
        for block in ([content] if isinstance(content, str) else content or ()):
            documents += isinstance(block, dict) and block.get("type") == "document"
            blocks += _block(block, documents)
        out.append({"role": role, "content": blocks})
    return out


def _tools(body: dict[str, Any]) -> dict[str, Any] | None:
    specs: list[dict[str, Any]] = []
    for tool in body.get("tools") or ():
        if not isinstance(tool, dict) or tool.get("type") not in (None, "custom"):
            kind = tool.get("type") if isinstance(tool, dict) else tool
            raise _bad(f"server tool {kind!r}: only the client's own tools can be offered")
        spec = {"name": tool.get("name"), "inputSchema": {"json": tool.get("input_schema")}}
        if tool.get("description"):
            spec["description"] = tool["description"]
        specs.append({"toolSpec": spec})
        if tool.get("cache_control"):
            specs.append(dict(CACHE_POINT))
    output = body.get("output_config")
    if output is not None and not isinstance(output, dict):
        raise _bad("'output_config' must be an object", "invalid_type")
    fmt = output.get("format") if output else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        if specs:
            raise _bad("a structured output with tools beside it")
        return {"tools": [{"toolSpec": {
            "name": JSON_TOOL, "description": "Give the answer as this tool's input.",
            "inputSchema": {"json": fmt.get("schema") or {"type": "object"}}}}],
            "toolChoice": {"tool": {"name": JSON_TOOL}}}
    if not specs:
        return None
    config: dict[str, Any] = {"tools": specs}
    choice = body.get("tool_choice")
    if not isinstance(choice, dict):
        return config
    kind = choice.get("type")
    if kind in ("auto", "any"):
        config["toolChoice"] = {kind: {}}
    elif kind == "tool":
        config["toolChoice"] = {"tool": {"name": choice.get("name")}}
    return config


def converse_request(body: dict[str, Any], model: str) -> dict[str, Any]:
    """The Converse request for an Anthropic Messages ``body`` (checked at the door) to
    ``model``; raises InvalidRequest (400) for what Converse cannot take."""
    for key in _REFUSED:
        if body.get(key):
            raise _bad(f"{key!r}")
    out: dict[str, Any] = {"model": model, "messages": _messages(body["messages"])}
    system = _text_blocks(body.get("system"), "system")
    if system:
        out["system"] = system
    inference: dict[str, Any] = {}
    for key, name in (("max_tokens", "maxTokens"), ("temperature", "temperature"),
                      ("top_p", "topP"), ("stop_sequences", "stopSequences")):
        if body.get(key) is not None:
            inference[name] = body[key]
    if inference:
        out["inferenceConfig"] = inference
    tools = _tools(body)
    if tools:
        out["toolConfig"] = tools
    elif any("toolUse" in b or "toolResult" in b for m in out["messages"] for b in m["content"]):
        # Bedrock's ValidationException, said before sending: the tools must be declared
        raise _bad("tool calls or results in messages without tools: Converse needs the "
                   "conversation's tools declared", "invalid_value")
    extra: dict[str, Any] = {}
    if body.get("top_k") is not None:
        extra["top_k"] = body["top_k"]
    if body.get("thinking") and "anthropic." in model:
        extra["thinking"] = body["thinking"]
    if extra:
        out["additionalModelRequestFields"] = extra
    return out
