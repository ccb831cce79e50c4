"""A fake of Google's model APIs for tests (raw ASGI, one app): the Gemini API, Vertex AI's
Gemini and Claude models, and the OAuth token endpoint Vertex's credentials use.

Routes (``POST``; anything else 404 in Google's error shape):

==========================================================================  ================
``/v1beta/models/{model}:generateContent``, ``:streamGenerateContent``      Gemini API
``/v1/projects/{p}/locations/{l}/publishers/google/models/{model}:...``     Vertex, Gemini
``/v1/projects/{p}/locations/{l}/publishers/anthropic/models/{model}:rawPredict``,
``:streamRawPredict``, ``.../models/count-tokens:rawPredict``               Vertex, Claude
``/token``                                                                  OAuth (JWT grant)
==========================================================================  ================

Auth as Google checks it: the Gemini API wants ``x-goog-api-key`` (none: 403
PERMISSION_DENIED; another than ``gemini_key``: 400 INVALID_ARGUMENT, reason
``API_KEY_INVALID``, as the real API answers); Vertex wants ``Authorization: Bearer`` with a
token the ``issuer`` (:class:`~gateway.testing.google_tokens.TokenIssuer`) granted and that
has not expired (else 401 UNAUTHENTICATED), for ``project`` (else 403 PERMISSION_DENIED).
Errors are Google's body, ``{"error": {"code", "message", "status"}}``.

Claude on Vertex is the Anthropic fake (:class:`~gateway.testing.fake_anthropic.FakeAnthropic`,
its steering headers, its checks, its simulated ``cache_control`` caching) behind Vertex's
differences: no ``model`` in the body (400), ``anthropic_version: "vertex-2023-10-16"`` in
it (400 otherwise), the method naming the stream (``streamRawPredict`` iff ``stream``).
Gemini answers: :mod:`gateway.testing.gemini_answers` (checks, answers, events, the implicit
cache with ``simulate_cache``); a stream wants ``?alt=sse`` and sends each chunk as one
``data:`` event (``x-fake-die-after``, ``x-fake-error-midway``: a chunk count; the error is
Google's body as an event, as Google sends one mid-stream). Steering, besides the others':

=========================  ===========================================================
``x-fake-google-status``    answer this status in Google's error shape (429
                            RESOURCE_EXHAUSTED, 503 UNAVAILABLE...), on every model route
``x-fake-retry-after``      retry-after header (seconds) sent with it
=========================  ===========================================================
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.testing.fake_anthropic import FakeAnthropic
from gateway.testing.fake_upstream import Record, _send_json, _wait
from gateway.testing.gemini_answers import ImplicitCache, answer, events, validate_request
from gateway.testing.google_tokens import GoogleError, TokenIssuer
from gateway.types import Receive, Scope, Send

__all__ = ["VERTEX_ANTHROPIC_VERSION", "FakeGoogle"]

VERTEX_ANTHROPIC_VERSION = "vertex-2023-10-16"
_METHOD = r":(?P<method>[A-Za-z]+)(?:\?(?P<query>.*))?$"
_GEMINI_API = re.compile(r"^/v1beta/models/(?P<model>[^/:?]+)" + _METHOD)
_VERTEX = re.compile(r"^/v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)"
                     r"/publishers/(?P<publisher>google|anthropic)/models/(?P<model>[^/:?]+)"
                     + _METHOD)
_API_KEY_INVALID = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                     "reason": "API_KEY_INVALID", "domain": "googleapis.com"}]


@dataclass
class FakeGoogle(FakeAnthropic):
    """The ASGI app. ``gemini_key``: the Gemini API key accepted (None: any);
    ``issuer``: Vertex's token endpoint (None: Vertex routes refuse every token);
    ``project``: the project Vertex routes serve. Records, ``wait_for``, ``clear``,
    ``simulate_cache`` as :class:`~gateway.testing.fake_upstream.FakeUpstream`'s."""

    gemini_key: str | None = None
    issuer: TokenIssuer | None = None
    project: str = "fake-project"
    _implicit: ImplicitCache = field(default_factory=ImplicitCache)

    async def _dispatch(self, path: str, headers: dict[str, str], data: Any, raw: bytes,
                        rec: Record, disconnected: asyncio.Event, send: Send) -> None:
        try:
            if path == "/token" and rec.method == "POST":
                if self.issuer is None:
                    raise GoogleError(404, "no token endpoint here")
                return await _send_json(send, 200, self.issuer.grant(raw), rec)
            found = _GEMINI_API.match(path) or _VERTEX.match(path)
            if found is None or rec.method != "POST":
                raise GoogleError(404, f"The requested URL {path} was not found on this "
                                       "server.")
            route = found.groupdict()
            if "project" in route:
                self._vertex_auth(headers, route["project"])
            else:
                self._gemini_auth(headers)
            if status := int(headers.get("x-fake-google-status", 0)):
                raise GoogleError(status, _MESSAGES.get(status, f"fake google error {status}"),
                                  retry_after=headers.get("x-fake-retry-after"))
            if not isinstance(data, dict):
                raise GoogleError(400, "Invalid JSON payload received.")
        except GoogleError as exc:
            extra = [(b"retry-after", exc.retry_after.encode())] if exc.retry_after else []
            return await _send_json(send, exc.code, exc.body, rec, extra)
        if route.get("publisher") == "anthropic":
            return await self._claude(route, headers, data, raw, rec, disconnected, send)
        return await self._gemini(route, headers, data, rec, disconnected, send)

    def _gemini_auth(self, headers: dict[str, str]) -> None:
        key = headers.get("x-goog-api-key")
        if not key:
            raise GoogleError(403, "Method doesn't allow unregistered callers (callers "
                                   "without established identity). Please use API Key or "
                                   "other form of API consumer identity to call this API.")
        if self.gemini_key is not None and key != self.gemini_key:
            raise GoogleError(400, "API key not valid. Please pass a valid API key.",
                              _API_KEY_INVALID)

    def _vertex_auth(self, headers: dict[str, str], project: str) -> None:
        if self.issuer is None:
            raise GoogleError(401, "Request had invalid authentication credentials.")
        self.issuer.check(headers.get("authorization"))
        if project != self.project:
            raise GoogleError(403, f"Permission 'aiplatform.endpoints.predict' denied on "
                                   f"resource '//aiplatform.googleapis.com/projects/{project}'"
                                   " (or it may not exist).")

    async def _claude(self, route: dict[str, str], headers: dict[str, str], data: Any,
                      raw: bytes, rec: Record, disconnected: asyncio.Event, send: Send) -> None:
        """Vertex's Claude: its checks, then the Anthropic fake's answer."""
        method, model = route["method"], route["model"]
        body = dict(data)
        try:
            if body.pop("anthropic_version", None) != VERTEX_ANTHROPIC_VERSION:
                raise GoogleError(400, "anthropic_version: must be "
                                       f"{VERTEX_ANTHROPIC_VERSION!r}")
            if model == "count-tokens":
                if method != "rawPredict":
                    raise GoogleError(400, "count-tokens takes rawPredict")
                path = "/v1/messages/count_tokens"
            else:
                if "model" in body:
                    raise GoogleError(400, "model: Extra inputs are not permitted (the "
                                           "model is named in the URL)")
                if method not in ("rawPredict", "streamRawPredict") or \
                        (method == "streamRawPredict") != bool(body.get("stream")):
                    raise GoogleError(400, f"{method}: use streamRawPredict with stream: true,"
                                           " rawPredict without")
                body["model"], path = model, "/v1/messages"
        except GoogleError as exc:
            return await _send_json(send, exc.code, exc.body, rec)
        # the Anthropic fake's own header checks stand for Vertex's (done above)
        anthropic = {**headers, "anthropic-version": "2023-06-01", "x-api-key": "vertex"}
        await super()._dispatch(path, anthropic, body, raw, rec, disconnected, send)

    async def _gemini(self, route: dict[str, str], headers: dict[str, str], data: Any,
                      rec: Record, disconnected: asyncio.Event, send: Send) -> None:
        """A Gemini model's answer, whole or as ``?alt=sse`` events."""
        method, query = route["method"], route.get("query") or ""
        try:
            if method not in ("generateContent", "streamGenerateContent"):
                raise GoogleError(404, f"method {method} not found")
            if method == "streamGenerateContent" and query != "alt=sse":
                raise GoogleError(400, "this fake streams only as server-sent events "
                                       "(?alt=sse)")
            validate_request(data)
        except GoogleError as exc:
            return await _send_json(send, exc.code, exc.body, rec)
        cached = self._implicit.cached(data, route["model"], headers.get(
            "x-fake-cache-scope", "")) if self.simulate_cache else 0
        whole = answer(data, route["model"], headers, cached)
        if method == "generateContent":
            return await _send_json(send, 200, whole, rec)
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream"), (b"x-content-type-options", b"nosniff")]})
        rec.first_byte = time.monotonic()
        die_after = int(headers.get("x-fake-die-after", -1))
        midway = int(headers.get("x-fake-error-midway", -1))
        itl = float(headers.get("x-fake-itl-ms", 0)) / 1000
        for i, chunk in enumerate(events(whole)):
            if i == die_after:
                raise ConnectionAbortedError("fake gemini: dying mid-stream on request")
            if i == midway:
                error = GoogleError(503, _MESSAGES[503]).body
                return await send({"type": "http.response.body", "more_body": False,
                                   "body": b"data: " + orjson.dumps(error) + b"\r\n\r\n"})
            if i and itl and await _wait(disconnected, itl) or disconnected.is_set():
                return
            await send({"type": "http.response.body", "more_body": True,
                        "body": b"data: " + orjson.dumps(chunk) + b"\r\n\r\n"})
            rec.chunks_sent += 1
        await send({"type": "http.response.body", "body": b""})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # the query string is part of what a route reads (?alt=sse): kept in the path
        if scope["type"] == "http" and scope.get("query_string"):
            scope = {**scope, "path": scope["path"] + "?" + scope["query_string"].decode()}
        await super().__call__(scope, receive, send)


_MESSAGES = {429: "Resource has been exhausted (e.g. check quota).",
             503: "The model is overloaded. Please try again later.",
             500: "An internal error has occurred."}
