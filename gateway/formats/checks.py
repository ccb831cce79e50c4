"""What every wire format checks first in a request body, and its 400s: one place, so the
OpenAI and Anthropic formats (and ``count_tokens``) word their errors alike.

Each error is an :class:`~gateway.errors.InvalidRequest` (400) whose ``param`` names the
field and whose ``code`` says what is wrong: ``missing_required_parameter``,
``invalid_type`` or ``invalid_value`` (``invalid_json`` for a body that is not JSON).

A body the gateway could not send on as it came is refused too, before anything reads it:
one nested deeper than :data:`MAX_DEPTH` (orjson, which every stage and translator writes
bodies with, writes at most 254 levels) or holding an integer outside the 64-bit range
(orjson reads it as a float: ``18446744073709551616`` would reach the upstream as
``1.8446744073709552e+19``, another request).
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from gateway.errors import InvalidJSON, InvalidRequest

__all__ = ["MAX_DEPTH", "invalid_type", "invalid_value", "load_request", "message_list",
           "missing", "shown"]

#: Arrays and objects nested deeper than this are refused (a 400).
MAX_DEPTH = 128
#: The integers orjson reads as integers.
_INT_RANGE = (-(2**63), 2**64 - 1)
_LONG_DIGITS = re.compile(rb"\d{20}")


def load_request(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object with a non-empty string ``model``; raises InvalidJSON or
    InvalidRequest."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidJSON(f"request body is not valid JSON: {exc.msg}") from exc
    if not isinstance(data, dict):
        raise InvalidRequest("request body must be a JSON object")
    # Both checks look at the raw bytes first, so most bodies pay two scans, no walk.
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH and _too_deep(data):
        raise InvalidRequest(f"request body nests arrays and objects deeper than "
                             f"{MAX_DEPTH} levels", code="invalid_value")
    if _LONG_DIGITS.search(raw):
        _check_integers(raw)
    model = data.get("model")
    if model is None:
        raise missing("model")
    if not isinstance(model, str) or not model:
        raise invalid_type("model", "a non-empty string", model)
    return data


def _too_deep(value: Any) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children
                     if isinstance(child, dict | list))
    return False


def _check_integers(raw: bytes) -> None:
    """Raises InvalidRequest for an integer outside the 64-bit range (a long run of digits
    was seen: read again, integers checked, strings ignored)."""
    def integer(text: str) -> int:
        value = int(text)
        if not _INT_RANGE[0] <= value <= _INT_RANGE[1]:
            raise InvalidRequest(f"request body holds the integer {text[:40]}, outside the "
                                 "64-bit range", code="invalid_value")
        return value

    try:
        json.loads(raw, parse_int=integer)
    except json.JSONDecodeError:  # what orjson read, the stdlib reads too; if not, orjson's
        pass


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
