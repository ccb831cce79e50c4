"""The errors the engine's HTTP server answers with.

Each knows its HTTP status and its OpenAI ``error.type``/``code`` and renders itself as the
OpenAI error JSON (:mod:`llm_wire.errors`,
https://platform.openai.com/docs/guides/error-codes)::

    EngineError              500 server_error / internal_error
     ├── InvalidRequest      400 invalid_request_error / invalid_request
     │    └── InvalidJSON    400 invalid_request_error / invalid_json
     └── GenerationFailed    502 upstream_error / upstream_error

The engine keeps its own small hierarchy, so it imports nothing from the gateway; the
values match the gateway's (InvalidRequest, InvalidJSON, UpstreamError), so a client sees
the same JSON whether the engine answers it directly or through the gateway.
"""

from __future__ import annotations

from llm_wire.errors import APIError

__all__ = ["EngineError", "GenerationFailed", "InvalidJSON", "InvalidRequest"]


class EngineError(APIError):
    """Base of every error that becomes an HTTP response (or a mid-stream error event):
    ``status``, ``type``, ``code``, ``param``, ``as_dict()`` and ``body()`` come from
    :class:`llm_wire.errors.APIError`."""


class InvalidRequest(EngineError):
    """The request body breaks the OpenAI API's rules, or asks for what the engine lacks;
    ``param`` names the field."""

    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class InvalidJSON(InvalidRequest):
    code = "invalid_json"


class GenerationFailed(EngineError):
    """The engine failed while streaming an answer: sent as the stream's last event, since
    the 200 status line has already gone out. Typed ``upstream_error`` because the client
    that sees it usually reaches the engine through the gateway, as one of its upstreams."""

    status = 502
    type = "upstream_error"
    code = "upstream_error"
