"""A request's span attributes, from its finished record and the client's request body
(pure: gateway.tracing sets them). OpenTelemetry semantic conventions 1.44.0: the GenAI
attributes (https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans/), HTTP's
``http.route`` and ``http.response.status_code``; the gateway's own under ``llm_gateway.``.

Never a key, never prompt or completion text unless ``capture_content``
(:func:`content_attributes`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from gateway.requestlog import RequestRecord

__all__ = ["GATEWAY_FIELDS", "OPERATIONS", "STAGE_FIELDS", "content_attributes",
           "request_attributes", "stage_attributes"]

#: The endpoint's kind -> ``gen_ai.operation.name`` (Anthropic's messages and the
#: Responses API are chat too).
OPERATIONS = {"chat": "chat", "completions": "text_completion", "embeddings": "embeddings"}

#: The request body's parameters the conventions name -> their attribute.
_PARAMETERS = (
    ("max_tokens", "gen_ai.request.max_tokens"),
    ("max_completion_tokens", "gen_ai.request.max_tokens"),
    ("max_output_tokens", "gen_ai.request.max_tokens"),  # Responses
    ("temperature", "gen_ai.request.temperature"),
    ("top_p", "gen_ai.request.top_p"),
    ("top_k", "gen_ai.request.top_k"),
    ("frequency_penalty", "gen_ai.request.frequency_penalty"),
    ("presence_penalty", "gen_ai.request.presence_penalty"),
    ("seed", "gen_ai.request.seed"),
)

#: Log-line fields a span carries as ``llm_gateway.<name>`` when set, not 0 or false (what
#: the stages and dispatch decided; gateway.requestlog says what each means).
GATEWAY_FIELDS = (
    "request_id", "api", "key_id", "upstream", "policy_version", "queue_ms", "overhead_ms",
    "upstream_ms", "retries", "cache", "cache_layer", "similarity", "verified", "lookup_ms",
    "late_hit", "router", "route_tier", "route_score", "route_threshold", "route_fallback",
    "route_ms", "route_sticky", "compression", "tokens_before", "tokens_after",
    "compress_ms", "compress_skip", "compress_fine", "prompt_cache_breakpoints",
    "rate_limit", "rate_limited", "coalesced", "shed", "first_token_timeouts", "stalled",
    "continued", "dropped_tools", "hedged", "cancelled",
)

#: Each stage's own log-line fields: its span carries them. A stage has a span only when
#: it did work worth a span (:data:`_WORKED`): a cache lookup, a tier chosen, a compression,
#: breakpoints placed or lines moved, a wait for a slot or a shed, a refusal, a shared call;
#: a check that let the request pass unchanged (a rate limit under its limit) is no span:
#: each span costs the SDK ~60 us to make and ~65 us to encode (README "Traces").
STAGE_FIELDS = {
    "rate_limit": ("rate_limit", "rate_limited"),
    "cache": ("cache", "cache_layer", "similarity", "verified", "lookup_ms", "late_hit"),
    "coalesce": ("coalesced",),
    "route": ("router", "route_tier", "route_score", "route_threshold", "route_fallback",
              "route_ms", "route_sticky"),
    "compress": ("compression", "tokens_before", "tokens_after", "compress_ms",
                 "compress_skip", "compress_fine"),
    "prompt_cache": ("prompt_cache_breakpoints",),
    "admission": ("shed",),
}


_WORKED: dict[str, Callable[[RequestRecord], bool]] = {
    "rate_limit": lambda r: r.rate_limited is not None or r.rate_limit == "fallback",
    "cache": lambda r: r.cache is not None,
    "coalesce": lambda r: r.coalesced is not None,
    "route": lambda r: r.route_tier is not None,
    "compress": lambda r: r.compress_ms is not None or r.compression is not None,
    "prompt_cache": lambda r: bool(r.prompt_cache_breakpoints or r.prompt_cache_moved),
    "admission": lambda r: bool(r.queue_ms or r.shed),
}


def stage_attributes(name: str, rec: RequestRecord) -> dict[str, Any] | None:
    """A stage's span attributes from what it recorded; None when it did no work worth a
    span (:data:`_WORKED`)."""
    worked = _WORKED.get(name)
    if worked is not None and not worked(rec):
        return None
    fields = rec.__dict__
    out = {"llm_gateway." + f: fields[f] for f in STAGE_FIELDS.get(name, ())
           if fields.get(f) is not None}
    if name == "admission" and rec.queue_ms:
        out["llm_gateway.queue_ms"] = rec.queue_ms
    elif name == "prompt_cache" and rec.prompt_cache_moved:
        for kind, count in rec.prompt_cache_moved.items():
            out["llm_gateway.prompt_cache_moved." + kind] = count
    return out


def request_attributes(rec: RequestRecord, body: dict[str, Any] | None, operation: str,
                       response_id: str | None) -> dict[str, Any]:
    """The request span's attributes (None values left out)."""
    fields = rec.__dict__
    out: dict[str, Any] = {
        "gen_ai.operation.name": operation,
        "http.route": rec.route,
        "http.response.status_code": rec.status,
        "gen_ai.request.stream": bool(rec.stream),
    }
    if rec.model_requested is not None:
        out["gen_ai.request.model"] = rec.model_requested
    if rec.model_served is not None:
        out["gen_ai.response.model"] = rec.model_served
    if body is not None:
        for key, name in _PARAMETERS:
            value = body.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                out[name] = value
        stop = body.get("stop", body.get("stop_sequences"))
        if isinstance(stop, str):
            out["gen_ai.request.stop_sequences"] = [stop]
        elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
            out["gen_ai.request.stop_sequences"] = stop
        n = body.get("n")
        if isinstance(n, int) and not isinstance(n, bool) and n != 1:
            out["gen_ai.request.choice.count"] = n
    if rec.prompt_tokens is not None:
        out["gen_ai.usage.input_tokens"] = rec.prompt_tokens
    if rec.completion_tokens is not None:
        out["gen_ai.usage.output_tokens"] = rec.completion_tokens
    if rec.cache_read_tokens is not None:
        out["gen_ai.usage.cache_read.input_tokens"] = rec.cache_read_tokens
    if rec.cache_write_tokens is not None:
        out["gen_ai.usage.cache_creation.input_tokens"] = rec.cache_write_tokens
    if rec.finish_reason is not None:
        out["gen_ai.response.finish_reasons"] = [rec.finish_reason]
    if response_id is not None:
        out["gen_ai.response.id"] = response_id
    if rec.ttft_ms is not None:
        out["gen_ai.response.time_to_first_chunk"] = rec.ttft_ms / 1000  # seconds
    if rec.error_type is not None:
        out["error.type"] = rec.error_type
    elif rec.status >= 400 and not rec.cancelled:
        out["error.type"] = str(rec.status)
    for name in GATEWAY_FIELDS:  # only what was set: 0, false and null are the defaults
        value = fields.get(name)
        if value:
            out["llm_gateway." + name] = value
    moved = rec.prompt_cache_moved
    if moved:
        for kind, count in moved.items():
            out["llm_gateway.prompt_cache_moved." + kind] = count
    return out


def content_attributes(ctx: Any, output: Any) -> dict[str, str]:
    """Opt-in content (``[tracing] capture_content``): ``gen_ai.input.messages``, the
    client's messages as OpenAI chat (JSON), and ``gen_ai.output.messages``, a whole
    answer's choices or content (JSON); a stream's output is not kept."""
    out: dict[str, str] = {}
    try:
        messages = ctx.chat.get("messages")
        if messages is not None:
            out["gen_ai.input.messages"] = orjson.dumps(messages).decode()
        if isinstance(output, dict):
            answer = output.get("choices", output.get("content", output.get("output")))
            if answer is not None:
                out["gen_ai.output.messages"] = orjson.dumps(answer).decode()
    except (TypeError, ValueError, AttributeError):  # a body the view cannot read
        pass
    return out
