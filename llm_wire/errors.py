"""The OpenAI error object, as both servers render it.

``{"error": {"message": ..., "type": ..., "param": ..., "code": ...}}``; see
https://platform.openai.com/docs/guides/error-codes.
"""

from __future__ import annotations

from typing import Any

import orjson

__all__ = ["error_body", "error_object"]


def error_object(message: str, type_: str, code: str | None = None,
                 param: str | None = None) -> dict[str, Any]:
    """The inner error object: ``{message, type, param, code}``."""
    return {"message": message, "type": type_, "param": param, "code": code}


def error_body(message: str, type_: str, code: str | None = None,
               param: str | None = None) -> bytes:
    """The whole error response body, serialised (bytes)."""
    return orjson.dumps({"error": error_object(message, type_, code, param)})
