"""The OpenAI error object, as both servers render it.

``{"error": {"message": ..., "type": ..., "param": ..., "code": ...}}``; see
https://platform.openai.com/docs/guides/error-codes.
"""

from __future__ import annotations

from typing import Any

import orjson

__all__ = ["APIError", "error_body", "error_object"]


def error_object(message: str, type_: str, code: str | None = None,
                 param: str | None = None) -> dict[str, Any]:
    """The inner error object: ``{message, type, param, code}``."""
    return {"message": message, "type": type_, "param": param, "code": code}


def error_body(message: str, type_: str, code: str | None = None,
               param: str | None = None) -> bytes:
    """The whole error response body, serialised (bytes)."""
    return orjson.dumps({"error": error_object(message, type_, code, param)})


class APIError(Exception):
    """Base of the errors either server answers with: each knows its HTTP ``status``, its
    OpenAI ``type`` and ``code``, the offending request field (``param``, or None) and extra
    response ``headers`` (e.g. ``Retry-After``), and renders itself as the error JSON."""

    status: int = 500
    type: str = "server_error"
    code: str | None = "internal_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers = headers or {}

    def as_dict(self) -> dict[str, Any]:
        """The inner error object: ``{message, type, param, code}``."""
        return error_object(self.message, self.type, self.code, self.param)

    def body(self) -> bytes:
        """The whole error response body, ``{"error": {...}}`` (bytes)."""
        return error_body(self.message, self.type, self.code, self.param)
