"""Parse and check OpenAI request bodies once, at the door.

Only what the gateway relies on is checked (the upstream validates the rest, and fields it
does not know pass through untouched, so new API fields work on day one). Errors follow the
OpenAI shape: ``invalid_request_error`` with ``param`` naming the field.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson

from gateway.errors import InvalidJSON, InvalidRequest

__all__ = ["Kind", "parse_body"]

Kind = Literal["chat", "completions", "embeddings"]

_NUMBERS: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
}
_POSITIVE_INTS = frozenset({"max_tokens", "max_completion_tokens", "n"})


def parse_body(body: bytes, kind: Kind) -> dict[str, Any]:
    """The request as a dict; raises InvalidJSON or InvalidRequest (400) naming the field."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidJSON(f"request body is not valid JSON: {exc.msg}") from exc
    if not isinstance(data, dict):
        raise InvalidRequest("request body must be a JSON object")
    model = data.get("model")
    if model is None:
        raise _missing("model")
    if not isinstance(model, str) or not model:
        raise _type("model", "a non-empty string", model)
    if kind == "chat":
        _check_messages(data.get("messages"))
    elif kind == "completions":
        if "prompt" not in data:
            raise _missing("prompt")
        if not isinstance(data["prompt"], (str, list)):
            raise _type("prompt", "a string or an array", data["prompt"])
    elif "input" not in data:
        raise _missing("input")
    stream = data.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _type("stream", "a boolean", stream)
    if kind == "embeddings" and stream:
        raise InvalidRequest("embeddings cannot be streamed", param="stream")
    options = data.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _type("stream_options", "an object", options)
    for name, value in data.items():  # only the fields present, usually a handful
        if value is None:
            continue
        bounds = _NUMBERS.get(name)
        if bounds is not None:
            lo, hi = bounds
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not lo <= value <= hi:
                raise InvalidRequest(f"'{name}' must be a number between {lo} and {hi}, "
                                     f"got {value!r}", param=name, code="invalid_value")
        elif name in _POSITIVE_INTS:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidRequest(f"'{name}' must be an integer >= 1, got {value!r}",
                                     param=name, code="invalid_value")
        elif name == "stop" and not (isinstance(value, str) or (
                isinstance(value, list) and all(isinstance(s, str) for s in value))):
            raise _type("stop", "a string or an array of strings", value)
    return data


def _check_messages(messages: Any) -> None:
    if messages is None:
        raise _missing("messages")
    if not isinstance(messages, list):
        raise _type("messages", "an array", messages)
    if not messages:
        raise InvalidRequest("'messages' must contain at least one message", param="messages",
                             code="invalid_value")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _type(f"messages[{i}]", "an object", message)
        if not isinstance(message.get("role"), str):
            raise InvalidRequest(f"'messages[{i}].role' is required and must be a string",
                                 param=f"messages[{i}].role", code="invalid_type")


def _missing(param: str) -> InvalidRequest:
    return InvalidRequest(f"missing required parameter: '{param}'", param=param,
                          code="missing_required_parameter")


def _type(param: str, expected: str, value: Any) -> InvalidRequest:
    shown = orjson.dumps(value).decode()[:80] if value is not None else "null"
    return InvalidRequest(f"'{param}' must be {expected}, got {shown}", param=param,
                          code="invalid_type")
