"""A fake Azure OpenAI resource for tests (raw ASGI): Azure's URLs, auth and extra fields in
front of :class:`~gateway.testing.fake_upstream.FakeUpstream`, which answers (OpenAI chat,
SSE streams, Responses, simulated automatic prompt caching: ``cached_tokens`` for a repeated
prefix of 1,024 tokens or more, as Azure reports it).

As the service does (https://learn.microsoft.com/azure/ai-foundry/openai/reference,
/api-version-lifecycle, /concepts/content-filter, /how-to/quota):

- auth first: the ``api-key`` header must be ``api_key``, or ``Authorization: Bearer``
  ``token``; else 401 with Azure's error body (``{"error": {"code": "401", "message"}}``);
- ``/openai/deployments/{deployment}/...`` needs ``?api-version=`` (a version it knows, else
  404 ``Resource not found``, as Azure answers); ``/openai/v1/...`` takes none; any other
  path is a 404;
- chat answers carry ``prompt_filter_results`` and each choice ``content_filter_results``;
  a stream opens with Azure's ``choices: []`` chunk holding the prompt's results (empty
  ``id``, ``model`` and ``object``);
- errors are Azure's shape: no ``type`` (or ``"type": null``), ``code`` a string.

Steering headers (beside FakeUpstream's ``x-fake-*``, which reach it unchanged):

============================  ===========================================================
``x-fake-throttle-ms``         answer 429 with ``retry-after-ms`` (this), ``retry-after``
                               (whole seconds, rounded up) and Azure's rate-limit body
``x-fake-throttle-times``      ... only for the first N requests with this ``x-fake-key``
``x-fake-content-filter``      ``prompt``: the 400 ``content_filter`` error with its
                               ``innererror``; ``completion``: a 200 whose finish reason
                               is ``content_filter``, its ``violence`` result filtered
============================  ===========================================================

Every request is also noted in :attr:`FakeAzure.seen` (refused ones included):
``(method, path, query string, credential header, monotonic arrival time)``.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, NamedTuple
from urllib.parse import parse_qs

import orjson

from gateway.testing.fake_upstream import FakeUpstream
from gateway.types import Message, Receive, Scope, Send

__all__ = ["API_VERSIONS", "FakeAzure", "Seen"]

#: Dated versions it serves (GA and preview, as the REST reference lists them).
API_VERSIONS = frozenset({"2024-06-01", "2024-10-21", "2024-12-01-preview",
                          "2025-01-01-preview", "2025-03-01-preview", "2025-04-01-preview"})
_SAFE = {name: {"filtered": False, "severity": "safe"}
         for name in ("hate", "self_harm", "sexual", "violence")}
_PROMPT = {**_SAFE, "jailbreak": {"filtered": False, "detected": False}}
_FILTERED = {**_SAFE, "violence": {"filtered": True, "severity": "medium"}}
_NOT_FOUND = {"error": {"code": "404", "message": "Resource not found"}}
_KEY_DENIED = ("Access denied due to invalid subscription key or wrong API endpoint. Make "
               "sure to provide a valid key for an active subscription and use a correct "
               "regional API endpoint for your resource.")
_TOKEN_DENIED = ("Unauthorized. Access token is missing, invalid, audience is incorrect "
                 "(https://cognitiveservices.azure.com), or have expired.")


class Seen(NamedTuple):
    """One request as it arrived: method, path, query string, the credential it carried
    (``api-key: ...`` or ``bearer ...``; "" for none), when (``time.monotonic()``, s)."""

    method: str
    path: str
    query: str
    credential: str
    arrived: float


def content_filter_error() -> dict[str, Any]:
    """Azure's 400 for a prompt its content filter refused (content-filter docs)."""
    return {"error": {
        "message": "The response was filtered due to the prompt triggering Azure OpenAI's "
                   "content management policy. Please modify your prompt and retry.",
        "type": None, "param": "prompt", "code": "content_filter", "status": 400,
        "innererror": {"code": "ResponsibleAIPolicyViolation",
                       "content_filter_result": _FILTERED}}}


@dataclass
class FakeAzure:
    """The ASGI app (module docstring). ``api_key`` / ``token``: the credentials it accepts
    (an empty one accepts none of its kind); ``inner``: the fake that answers."""

    api_key: str = "azure-fake-key"
    token: str = ""
    inner: FakeUpstream = field(default_factory=lambda: FakeUpstream(simulate_cache=True))
    seen: list[Seen] = field(default_factory=list)
    _throttled: Counter[str] = field(default_factory=Counter)

    def clear(self) -> None:
        self.inner.clear()
        self.seen.clear()
        self._throttled.clear()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.inner(scope, receive, send)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        path, query = scope["path"], scope.get("query_string", b"").decode("latin-1")
        bearer = headers.get("authorization", "")
        credential = f"api-key: {headers['api-key']}" if "api-key" in headers else \
            bearer.replace("Bearer ", "bearer ", 1)
        self.seen.append(Seen(scope["method"], path, query, credential, time.monotonic()))
        refused = self._refusal(path, parse_qs(query), headers)
        if refused is not None:
            status, body, extra = refused
            return await _send_json(send, status, body, extra)
        filtered = headers.get("x-fake-content-filter") == "completion"
        if filtered:  # the inner fake ends its answer with this finish reason
            scope = {**scope, "headers": [*scope["headers"],
                                          (b"x-fake-finish", b"content_filter")]}
        chat = path.endswith("/chat/completions")
        await self.inner(scope, receive, _Decorated(send, filtered) if chat else send)

    def _refusal(self, path: str, query: dict[str, list[str]], headers: dict[str, str]
                 ) -> tuple[int, Any, list[tuple[bytes, bytes]]] | None:
        """What Azure answers instead of the model, in its order: auth, path, version,
        then the steered throttling and prompt filter; None: the model answers."""
        key, bearer = headers.get("api-key"), headers.get("authorization", "")
        if not ((self.api_key and key == self.api_key)
                or (self.token and key is None and bearer == f"Bearer {self.token}")):
            message = _KEY_DENIED if key is not None or not bearer else _TOKEN_DENIED
            return 401, {"error": {"code": "401", "message": message}}, []
        parts = path.split("/")
        if path.startswith("/openai/deployments/") and len(parts) > 4 and parts[3]:
            version = (query.get("api-version") or [""])[0]
            if version not in API_VERSIONS:
                return 404, _NOT_FOUND, []
        elif not path.startswith("/openai/v1/"):
            return 404, _NOT_FOUND, []
        throttle = headers.get("x-fake-throttle-ms")
        if throttle is not None and self._throttles(headers):
            ms = int(throttle)
            seconds = math.ceil(ms / 1000)
            return 429, {"error": {"code": "429", "message": (
                "Requests to the ChatCompletions_Create Operation under Azure OpenAI API "
                "have exceeded token rate limit of your current OpenAI S0 pricing tier. "
                f"Please retry after {seconds} seconds.")}}, [
                (b"retry-after-ms", str(ms).encode()), (b"retry-after", str(seconds).encode()),
                (b"x-ratelimit-remaining-requests", b"0"),
                (b"x-ratelimit-remaining-tokens", b"0")]
        if headers.get("x-fake-content-filter") == "prompt":
            return 400, content_filter_error(), []
        return None

    def _throttles(self, headers: dict[str, str]) -> bool:
        times = headers.get("x-fake-throttle-times")
        if times is None:
            return True
        key = headers.get("x-fake-key", "")
        self._throttled[key] += 1
        return self._throttled[key] <= int(times)


class _Decorated:
    """``send`` for a chat answer: Azure's content-filter fields added to each JSON body
    or SSE event the inner fake sends (one event per message, as it sends them)."""

    def __init__(self, send: Send, filtered: bool) -> None:
        self._send, self._filtered = send, filtered
        self._start: Message | None = None
        self._sse = self._opened = False
        self._held = b""

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            ctype = dict(message.get("headers", [])).get(b"content-type", b"")
            self._sse = ctype.startswith(b"text/event-stream")
            if message["status"] == 200 and ctype.startswith(b"application/json"):
                self._start = message  # sent with the body: its length changes
                return
            return await self._send(message)
        if message["type"] != "http.response.body":
            return await self._send(message)
        body = message.get("body", b"")
        if self._start is not None:
            self._held += body
            if message.get("more_body"):
                return
            obj = orjson.loads(self._held)
            obj["prompt_filter_results"] = [{"prompt_index": 0,
                                             "content_filter_results": _PROMPT}]
            for choice in obj.get("choices") or ():
                choice["content_filter_results"] = self._results(choice)
            return await _send_json(self._send, self._start["status"], obj, [])
        if self._sse and body.startswith(b"data: {"):
            obj = orjson.loads(body[6:])
            out = b""
            if not self._opened:  # Azure's first chunk: the prompt's results alone
                self._opened = True
                out = _event({"choices": [], "created": 0, "id": "", "model": "",
                              "object": "", "prompt_filter_results": [
                                  {"prompt_index": 0, "content_filter_results": _PROMPT}]})
            for choice in obj.get("choices") or ():
                delta = choice.get("delta") or {}
                choice["content_filter_results"] = self._results(choice) if (
                    delta.get("content") or choice.get("finish_reason")) else {}
            message = {**message, "body": out + _event(obj)}
        await self._send(message)

    def _results(self, choice: dict[str, Any]) -> dict[str, Any]:
        done = choice.get("finish_reason") == "content_filter"
        return _FILTERED if self._filtered and done else _SAFE


def _event(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


async def _send_json(send: Send, status: int, obj: Any,
                     extra: list[tuple[bytes, bytes]]) -> None:
    body = orjson.dumps(obj)
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        *extra]})
    await send({"type": "http.response.body", "body": body})
