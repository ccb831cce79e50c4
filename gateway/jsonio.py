"""Whole JSON bodies in and out, on the request path: the request, an upstream's whole
answer, a cached entry, and what the gateway sends upstream.

Every such body is parsed here, once per request: the parsed form then flows (the request
as ``RequestContext.body``, an answer as ``Reply.json``, a cached entry memoised on its
``Entry``), so a test can count the calls of :func:`loads` on each path
(tests/gateway/test_parse_once.py). Smaller JSON (a stream's events, a tool call's
arguments) is read with orjson directly where it is needed.
"""

from __future__ import annotations

from typing import Any

import orjson

__all__ = ["JSONDecodeError", "dumps", "loads"]

JSONDecodeError = orjson.JSONDecodeError


def loads(data: bytes) -> Any:
    """``data`` parsed; raises JSONDecodeError (a ValueError)."""
    return orjson.loads(data)


def dumps(obj: Any) -> bytes:
    """``obj`` as compact JSON bytes; raises orjson.JSONEncodeError (a TypeError)."""
    return orjson.dumps(obj)
