"""What every wire format checks first in a request body, and its 400s: one place, so the
OpenAI and Anthropic formats (and ``count_tokens``) word their errors alike.

Each error is an :class:`~gateway.errors.InvalidRequest` (400) whose ``param`` names the
field and whose ``code`` says what is wrong: ``missing_required_parameter``,
``invalid_type`` or ``invalid_value`` (``invalid_json`` for a body that is not JSON).
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.errors import InvalidJSON, InvalidRequest

__all__ = ["invalid_type", "invalid_value", "load_request", "message_list", "missing", "shown"]


def load_request(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object with a non-empty string ``model``; raises InvalidJSON or
    InvalidRequest."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidJSON(f"request body is not valid JSON: {exc.msg}") from exc
    if not isinstance(data, dict):
        raise InvalidRequest("request body must be a JSON object")
    model = data.get("model")
    if model is None:
        raise missing("model")
    if not isinstance(model, str) or not model:
        raise invalid_type("model", "a non-empty string", model)
    return data


def message_list(messages: Any) -> list[Any]:
    """``messages`` when it is a non-empty array; raises InvalidRequest."""
    if messages is None:
        raise missing("messages")
    if not isinstance(messages, list):
        raise invalid_type("messages", "an array", messages)
    if not messages:
        raise invalid_value("messages", "'messages' must contain at least one message")
    return messages


def shown(value: Any) -> str:
    """A value as an error message quotes it: JSON, at most 80 characters."""
    return orjson.dumps(value).decode()[:80] if value is not None else "null"


def missing(param: str) -> InvalidRequest:
    return InvalidRequest(f"missing required parameter: '{param}'", param=param,
                          code="missing_required_parameter")


def invalid_type(param: str, expected: str, value: Any) -> InvalidRequest:
    return InvalidRequest(f"'{param}' must be {expected}, got {shown(value)}", param=param,
                          code="invalid_type")


def invalid_value(param: str, message: str) -> InvalidRequest:
    return InvalidRequest(message, param=param, code="invalid_value")
