"""A Responses request as a Chat Completions request (for the local engine and
OpenAI-compatible servers that speak only chat). Pure, no I/O.

What maps to what:

=============================  ===============================================================
Responses                      Chat Completions
=============================  ===============================================================
``instructions``, ``input``    ``messages`` (:func:`gateway.formats.responses.input_messages`)
``tools``, ``tool_choice``     ``tools`` as functions (function, namespace and custom tools;
                               :mod:`.tools`), ``tool_choice`` likewise
``text.format`` json_schema    ``response_format`` json_schema (json_object likewise)
``max_output_tokens``          ``max_completion_tokens`` (left out when absent: the upstream's
                               default; ``default_max_tokens`` only where the upstream's API
                               requires a limit: Anthropic, after the chat translation)
``temperature``, ``top_p``,    the same
``parallel_tool_calls``,
``prompt_cache_key``, ``user``
``stream``                     ``stream`` with ``stream_options.include_usage``
=============================  ===============================================================

A 400 instead: a hosted tool (web search, file search, code interpreter, ...: the upstream
cannot run it; the policy's ``hosted_tools = "drop"`` leaves them out before, in
:mod:`gateway.outbound`), ``previous_response_id`` (left in only when the gateway's response store
does not hold it: :mod:`gateway.response_store.store`), ``conversation`` and ``prompt``
(a conversation or a prompt template OpenAI keeps: without it the answer would differ);
``background`` never gets here (:func:`gateway.formats.responses.parse_request`). Dropped (nothing to say them to; the answer's text does not depend on
them): ``store``, ``metadata``, ``include``, ``reasoning``, ``truncation``, ``service_tier``,
``safety_identifier``, ``top_logprobs`` (the answer carries no logprobs), ``max_tool_calls``,
``text.verbosity``, ``prompt_cache_retention``, ``stream_options``, and reasoning items of
the input.
Sources: https://platform.openai.com/docs/api-reference/responses,
https://platform.openai.com/docs/api-reference/chat
"""

from __future__ import annotations

from typing import Any

from gateway.errors import InvalidRequest
from gateway.formats.responses import input_messages
from gateway.formats.responses_to_openai.tools import chat_tool_choice, chat_tools

__all__ = ["chat_request"]

_SAME = ("temperature", "top_p", "parallel_tool_calls", "prompt_cache_key", "user")
_NOT_HELD = ("names a response this gateway does not hold: only an upstream that keeps "
             "responses itself can continue it")
_KEPT_UPSTREAM = "is kept by OpenAI: only a native_responses upstream can serve it"
_REFUSED = {"previous_response_id": (_NOT_HELD, "previous_response_not_found"),
            "conversation": (_KEPT_UPSTREAM, "unsupported_parameter"),
            "prompt": (_KEPT_UPSTREAM, "unsupported_parameter")}


def _response_format(text: Any) -> dict[str, Any] | None:
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    if fmt["type"] == "json_schema":
        schema = {k: fmt[k] for k in ("name", "description", "schema", "strict") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    raise InvalidRequest(f"text.format type {fmt['type']!r} is not known",
                         param="text.format", code="invalid_value")


def chat_request(body: dict[str, Any], model: str, default_max_tokens: int
                 ) -> dict[str, Any]:
    """The Chat Completions request for ``model`` of a checked Responses ``body``; raises
    InvalidRequest (400) naming what the chat format cannot express."""
    for key, (why, code) in _REFUSED.items():
        if body.get(key):
            raise InvalidRequest(f"'{key}' {why}", param=key, code=code)
    tools, names = chat_tools(body)
    out: dict[str, Any] = {"model": model, "messages": input_messages(body, names=names)}
    if tools:
        out["tools"] = tools
    if "tool_choice" in body:
        choice = chat_tool_choice(body["tool_choice"], names, bool(tools))
        if choice is not None or body["tool_choice"] is None:
            out["tool_choice"] = choice
    fmt = _response_format(body.get("text"))
    if fmt is not None:
        out["response_format"] = fmt
    if body.get("max_output_tokens"):  # absent: the upstream's own default, as asked
        out["max_completion_tokens"] = body["max_output_tokens"]
    for key in _SAME:
        if key in body and (tools or key != "parallel_tool_calls"):
            out[key] = body[key]
    if body.get("stream"):
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    return out
