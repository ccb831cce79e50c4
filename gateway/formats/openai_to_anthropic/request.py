"""An OpenAI client calling an Anthropic upstream: its Chat Completions request becomes a
Messages request. Pure, no I/O.

    anthropic_request(body, model, default_max_tokens) -> the Messages request (a dict)

Inputs are the request dicts as the door checked them (only what the gateway reads: the rest
is read here, through :mod:`gateway.formats.checks`' readers, a field of the wrong shape a
400 naming it). What has no equivalent raises :class:`~gateway.errors.InvalidRequest` (400,
code ``unsupported_parameter`` or ``unsupported_value``, ``param`` naming the field, the
message naming the feature); a default value that changes nothing (``n: 1``,
``presence_penalty: 0``...) does not.

Request, OpenAI -> Anthropic (any field not listed here raises too)::

    system / developer messages       top-level system, in order, wherever they sit: a string
                                      (joined with "\\n\\n") unless a part has a cache breakpoint
    user / assistant messages         turns; consecutive ones of a role merged (Anthropic wants
                                      alternation); empty text dropped (Anthropic rejects it)
    name (on messages)                dropped
    text part                         text block; prompt_cache_breakpoint -> cache_control
                                      ephemeral (ttl "12h" -> "1h", else Anthropic's 5m)
    image_url part                    image block: data: URL -> base64 source, http(s) -> url
                                      source; detail dropped
    file part, PDF file_data          document block (base64); file_id, other types: 400
    input_audio part, audio           400
    assistant tool_calls              tool_use blocks (input = the parsed arguments; ids made
                                      safe for Anthropic); arguments not a JSON object: 400
    assistant refusal                 its text
    tool messages                     tool_result blocks, first in their user message
    a first turn by the assistant     400: Anthropic rejects it and no user turn is invented
    max_completion_tokens|max_tokens  max_tokens, else ``default_max_tokens``
    temperature, top_p, top_k         same, but left out at 1 (the default); temperature above
                                      1: 400 (Anthropic's range is 0..1). Anthropic deprecates
                                      them: its SDK no longer types them and newer models
                                      refuse them (the upstream's 400 says so); older ones
                                      still sample with them. top_k is a vLLM extension.
    stop (string | list)              stop_sequences
    user (else safety_identifier)     metadata.user_id
    stream                            stream
    tools (type function)             {name, description, input_schema: parameters, strict}
    tool_choice                       auto|required|none|{function} -> auto|any|none|tool
                                      (left out, like parallel_tool_calls, without tools)
    parallel_tool_calls: false        disable_parallel_tool_use: true (on an auto tool_choice
                                      when none is given)
    response_format json_schema       output_config.format json_schema; json_object: 400
    n > 1, logprobs, top_logprobs,
    logit_bias, seed, non-zero penalties, prediction, reasoning_effort, web_search_options,
    moderation, verbosity (but "medium"), modalities with audio,
    functions / function_call / function messages (legacy)   400
    stream_options, store, service_tier, prompt_cache_key, prompt_cache_options,
    prompt_cache_retention, metadata (OpenAI's, for stored completions)
                                      dropped: they do not change the answer

Output key order: model, max_tokens, tools, tool_choice, system, messages, then the rest, so
that what a prompt cache keys on comes first.
Sources: https://docs.anthropic.com/en/api/messages,
https://platform.openai.com/docs/api-reference/chat, https://docs.anthropic.com/en/api/errors
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from gateway.errors import InvalidRequest
from gateway.formats.checks import a_string, an_array, an_object, invalid_type, required
from gateway.formats.openai_only import NO_EQUIVALENT, never
from gateway.formats.translator import tool_use_id

__all__ = ["anthropic_request"]

_UPSTREAM = "an Anthropic upstream"
_JOIN = "\n\n"  # between system prompts


#: Fields with no Anthropic equivalent: OpenAI's own (gateway.formats.openai_only), and
#: sampling settings Claude does not take.
_NO_EQUIVALENT: dict[str, tuple[str, Callable[[Any], bool]]] = {
    **NO_EQUIVALENT,
    "seed": ("'seed'", never),
    "presence_penalty": ("a non-zero 'presence_penalty'", lambda v: v == 0),
    "frequency_penalty": ("a non-zero 'frequency_penalty'", lambda v: v == 0),
    "reasoning_effort": ("'reasoning_effort' (use POST /v1/messages with 'thinking')",
                         never),
}
_DROPPED = frozenset({"model", "stream_options", "store", "service_tier", "prompt_cache_key",
                      "prompt_cache_options", "prompt_cache_retention", "metadata"})
_MAPPED = frozenset({"messages", "max_tokens", "max_completion_tokens", "temperature",
                     "top_p", "top_k", "stop", "user", "safety_identifier", "stream", "tools",
                     "tool_choice", "parallel_tool_calls", "response_format"})
#: Sent values equal to these defaults (the same on both APIs) are left out: newer Claude
#: models refuse temperature and top_p together, even at their defaults.
_SAMPLING_DEFAULTS = {"temperature": 1, "top_p": 1}
_IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})


def _unsupported(feature: str, param: str, code: str = "unsupported_parameter",
                 hint: str = "") -> InvalidRequest:
    return InvalidRequest(f"{feature} is not supported when the model is served by "
                          f"{_UPSTREAM}{hint}", param=param, code=code)


def anthropic_request(body: dict[str, Any], model: str,
                      default_max_tokens: int) -> dict[str, Any]:
    """The Messages request for ``model`` asking what the Chat Completions request ``body``
    (a validated dict) asks; ``max_tokens`` (required by Anthropic) is
    ``default_max_tokens`` when the body sets none. Raises InvalidRequest (400) for what has
    no equivalent (table in the module docstring)."""
    for key, value in body.items():
        if value is None or key in _DROPPED or key in _MAPPED:
            continue
        feature, harmless = _NO_EQUIVALENT.get(key, (f"'{key}'", never))
        if not harmless(value):
            code = "unsupported_parameter" if harmless is never else "unsupported_value"
            raise _unsupported(feature, key, code)
    system, messages = _messages(body["messages"])
    max_tokens = body.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    if max_tokens is None:
        max_tokens = default_max_tokens
    out: dict[str, Any] = {"model": model, "max_tokens": max_tokens}
    tools = [_tool(t, i) for i, t in enumerate(an_array(body.get("tools"), "tools"))]
    if tools:
        out["tools"] = tools
        choice = _tool_choice(body.get("tool_choice"), body.get("parallel_tool_calls"))
        if choice is not None:
            out["tool_choice"] = choice
    if system:
        plain = all(block.keys() == {"type", "text"} for block in system)
        out["system"] = _JOIN.join(b["text"] for b in system) if plain else system
    out["messages"] = messages
    temperature = body.get("temperature")
    if temperature is not None and (isinstance(temperature, bool)
                                    or not isinstance(temperature, (int, float))):
        raise invalid_type("temperature", "a number", temperature)  # a Responses client's
    if temperature is not None and temperature > 1:
        raise _unsupported("'temperature' above 1", "temperature", "unsupported_value",
                           " (Anthropic's range is 0 to 1)")
    for key in ("temperature", "top_p", "top_k"):
        if body.get(key) is not None and body[key] != _SAMPLING_DEFAULTS.get(key):
            out[key] = body[key]
    stop = body.get("stop")
    stops = [s for s in ([stop] if isinstance(stop, str) else stop or ()) if s]
    if stops:
        out["stop_sequences"] = stops
    user = body.get("user") or body.get("safety_identifier")
    if user:
        out["metadata"] = {"user_id": user}
    fmt = body.get("response_format")
    if fmt is not None and an_object(fmt, "response_format").get("type") != "text":
        out["output_config"] = {"format": _output_format(fmt)}
    if body.get("stream") is not None:
        out["stream"] = body["stream"]
    return out


def _output_format(fmt: dict[str, Any]) -> dict[str, Any]:
    schema = an_object(fmt.get("json_schema") or {}, "response_format.json_schema").get("schema")
    if fmt.get("type") != "json_schema" or schema is None:
        raise _unsupported(f"response_format '{fmt.get('type')}' without a JSON schema",
                           "response_format", "unsupported_value",
                           " (use {\"type\": \"json_schema\", ...})")
    return {"type": "json_schema", "schema": schema}


def _tool(tool: Any, i: int) -> dict[str, Any]:
    where = f"tools[{i}]"
    kind = an_object(tool, where).get("type")
    if kind != "function":
        raise _unsupported(f"{_shown(kind)} tools ({where})", f"{where}.type",
                           "unsupported_value")
    function = an_object(required(tool, "function", f"{where}.function"), f"{where}.function")
    out: dict[str, Any] = {"name": a_string(function.get("name"), f"{where}.function.name")}
    if function.get("description"):
        out["description"] = function["description"]
    schema = an_object(function.get("parameters") or {"properties": {}},
                       f"{where}.function.parameters")
    out["input_schema"] = schema if "type" in schema else {"type": "object", **schema}
    if function.get("strict"):
        out["strict"] = True
    return out


def _tool_choice(choice: Any, parallel: Any) -> dict[str, Any] | None:
    out: dict[str, Any] | None
    if choice is None:
        out = None
    elif isinstance(choice, str) and choice in ("auto", "required", "none"):
        out = {"type": {"auto": "auto", "required": "any", "none": "none"}[choice]}
    elif isinstance(choice, dict) and choice.get("type") == "function":
        function = an_object(required(choice, "function", "tool_choice.function"),
                             "tool_choice.function")
        out = {"type": "tool", "name": a_string(function.get("name"),
                                                "tool_choice.function.name")}
    else:
        kind = choice.get("type") if isinstance(choice, dict) else choice
        raise _unsupported(f"tool_choice {_shown(kind)}", "tool_choice", "unsupported_value")
    if parallel is False and (out is None or out["type"] != "none"):
        out = {**(out or {"type": "auto"}), "disable_parallel_tool_use": True}
    return out


# -- messages --------------------------------------------------------------------------------

def _shown(value: Any) -> str:
    """A client's value as a message quotes it (its repr, at most 60 characters)."""
    return repr(value)[:60]


def _cache(part: dict[str, Any], at: str) -> dict[str, Any]:
    """``cache_control`` for a part's ``prompt_cache_breakpoint`` (both mark a prefix end)."""
    breakpoint_ = part.get("prompt_cache_breakpoint")
    if not breakpoint_:
        return {}
    breakpoint_ = an_object(breakpoint_, f"{at}.prompt_cache_breakpoint")
    control = {"type": "ephemeral"}
    if breakpoint_.get("ttl") == "12h":  # the longest Anthropic keeps
        control["ttl"] = "1h"
    return {"cache_control": control}


def _text_blocks(content: Any, where: str) -> list[dict[str, Any]]:
    """Text blocks of a string or of text (and refusal) parts; empty text is dropped."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    out = []
    for j, part in enumerate(_parts(content, where)):
        at = f"{where}.content[{j}]"
        kind = an_object(part, at).get("type")
        if kind not in ("text", "refusal"):
            raise _unsupported(f"{_shown(kind)} parts here ({at})", at, "unsupported_value")
        out.extend(_text_part(part, kind, at))
    return out


def _text_part(part: dict[str, Any], kind: str, at: str) -> list[dict[str, Any]]:
    """A text (or refusal) part as a text block; none for empty text."""
    if not part.get(kind):
        return []
    return [{"type": "text", "text": a_string(part[kind], f"{at}.{kind}"), **_cache(part, at)}]


def _parts(content: Any, where: str) -> list[Any]:
    """A message's content parts (none for null); InvalidRequest for another shape."""
    if content is None:
        return []
    if not isinstance(content, list):
        raise invalid_type(f"{where}.content", "a string or an array of content parts",
                           content)
    return content


def _messages(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]],
                                                       list[dict[str, Any]]]:
    system: list[dict[str, Any]] = []
    turns: list[tuple[int, str, list[dict[str, Any]]]] = []  # (first index, role, blocks)
    for i, message in enumerate(messages):
        role, where = message.get("role"), f"messages[{i}]"
        if role in ("system", "developer"):
            system.extend(_text_blocks(message.get("content"), where))
            continue
        if role == "user":
            blocks = _user_blocks(message.get("content"), where)
        elif role == "assistant":
            blocks = _assistant_blocks(message, where)
        elif role == "tool":
            role, blocks = "user", [_tool_result(message, where)]
        elif role == "function":
            raise _unsupported("legacy 'function' messages (use 'tool')", f"{where}.role")
        else:
            raise _unsupported(f"the message role {role!r}", f"{where}.role",
                               "unsupported_value")
        if not blocks:
            continue
        if turns and turns[-1][1] == role:
            turns[-1][2].extend(blocks)
        else:
            turns.append((i, role, blocks))
    if not turns:
        raise InvalidRequest("'messages' must contain a user message", param="messages",
                             code="invalid_value")
    if turns[0][1] != "user":
        raise _unsupported("a conversation that starts with an assistant message",
                           f"messages[{turns[0][0]}]", "unsupported_value",
                           " (Anthropic requires a user message first)")
    out = []
    for _, role, blocks in turns:
        if role == "user":  # Anthropic wants the tool results first in their message
            blocks.sort(key=lambda block: block["type"] != "tool_result")
        if len(blocks) == 1 and blocks[0].keys() == {"type", "text"}:
            out.append({"role": role, "content": blocks[0]["text"]})
        else:
            out.append({"role": role, "content": blocks})
    return system, out


def _user_blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str) or content is None:
        return _text_blocks(content, where)
    out = []
    for j, part in enumerate(_parts(content, where)):
        at = f"{where}.content[{j}]"
        kind = an_object(part, at).get("type")
        if kind == "text":
            out.extend(_text_part(part, kind, at))
        elif kind == "image_url":
            image = an_object(required(part, "image_url", f"{at}.image_url"), f"{at}.image_url")
            source = _image_source(a_string(image.get("url"), f"{at}.image_url.url"), at)
            out.append({"type": "image", "source": source, **_cache(part, at)})
        elif kind == "file":
            source = _pdf_source(an_object(required(part, "file", f"{at}.file"), f"{at}.file"),
                                 at)
            out.append({"type": "document", "source": source, **_cache(part, at)})
        else:
            raise _unsupported(f"{_shown(kind)} content parts ({at})", at, "unsupported_value")
    return out


def _image_source(url: str, at: str) -> dict[str, Any]:
    if url.startswith(("http://", "https://")):
        return {"type": "url", "url": url}
    header, _, data = url.partition(",")
    media_type = header.removeprefix("data:").removesuffix(";base64")
    if not header.startswith("data:") or not header.endswith(";base64") \
            or media_type not in _IMAGE_TYPES:
        raise _unsupported(f"images other than http(s) URLs or base64 data: URLs of "
                           f"{', '.join(sorted(_IMAGE_TYPES))} ({at})",
                           f"{at}.image_url.url", "unsupported_value")
    return {"type": "base64", "media_type": media_type, "data": data}


def _pdf_source(file: dict[str, Any], at: str) -> dict[str, Any]:
    data = a_string(file.get("file_data") or "", f"{at}.file.file_data")
    if data.startswith("data:application/pdf;base64,"):
        data = data.partition(",")[2]
    elif not data.startswith("JVBER"):  # a PDF ("%PDF-") in base64, sent without a data: URL
        what = "OpenAI file ids ('file_id')" if file.get("file_id") else "files other than PDF"
        raise _unsupported(f"{what} ({at})", f"{at}.file", "unsupported_value")
    return {"type": "base64", "media_type": "application/pdf", "data": data}


def _assistant_blocks(message: dict[str, Any], where: str) -> list[dict[str, Any]]:
    if message.get("audio") is not None:
        raise _unsupported(f"assistant audio ({where}.audio)", f"{where}.audio")
    if message.get("function_call") is not None:
        raise _unsupported("legacy 'function_call' (use 'tool_calls')",
                           f"{where}.function_call")
    blocks = _text_blocks(message.get("content"), where)
    if not blocks and message.get("refusal"):
        blocks = [{"type": "text", "text": a_string(message["refusal"], f"{where}.refusal")}]
    for k, call in enumerate(an_array(message.get("tool_calls"), f"{where}.tool_calls")):
        at = f"{where}.tool_calls[{k}]"
        kind = an_object(call, at).get("type", "function")
        if kind != "function":
            raise _unsupported(f"{_shown(kind)} tool calls ({at})", f"{at}.type",
                               "unsupported_value")
        function = an_object(required(call, "function", f"{at}.function"), f"{at}.function")
        try:  # (orjson refuses what is not a string or bytes as JSON it cannot read)
            arguments = orjson.loads(function.get("arguments") or "{}")
        except orjson.JSONDecodeError:
            arguments = None
        if not isinstance(arguments, dict):
            raise InvalidRequest(f"'{at}.function.arguments' must be a JSON object to be "
                                 f"sent to {_UPSTREAM}", param=f"{at}.function.arguments",
                                 code="invalid_value")
        blocks.append({"type": "tool_use", "id": tool_use_id(call.get("id")),
                       "name": a_string(function.get("name"), f"{at}.function.name"),
                       "input": arguments})
    return blocks


def _tool_result(message: dict[str, Any], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "tool_result",
                           "tool_use_id": tool_use_id(message.get("tool_call_id"))}
    blocks = _text_blocks(message.get("content"), where)
    if len(blocks) == 1 and blocks[0].keys() == {"type", "text"}:
        out["content"] = blocks[0]["text"]
    elif blocks:
        out["content"] = blocks
    return out
