"""The client-facing APIs the gateway speaks, each a bundle of its wire format's pure
functions, so the endpoint and the stages serve either without knowing which.

- ``OPENAI``: Chat Completions (and completions, embeddings) on ``/v1/...``
  (:mod:`gateway.formats.openai`, :mod:`gateway.formats.openai_stream`).
- ``ANTHROPIC``: Messages on ``/v1/messages`` (:mod:`gateway.formats.anthropic`).
- ``RESPONSES``: OpenAI Responses on ``/v1/responses`` (:mod:`gateway.formats.responses`),
  served by OpenAI-style upstreams through their chat endpoint.

A request keeps its caller's format end to end; it is translated only on its way to an
upstream speaking the other one, and the answer back (:mod:`gateway.formats.bridge`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from gateway.errors import GatewayError
from gateway.formats import anthropic, openai, responses, responses_stream
from gateway.formats.answer import Answer
from gateway.formats.openai import RequestKind
from gateway.formats.openai_stream import StreamObserver

__all__ = ["ANTHROPIC", "APIS", "OPENAI", "RESPONSES", "ApiFormat", "Collector", "Observer"]

ApiName = Literal["openai", "anthropic", "responses"]


class Observer(Protocol):
    """Cuts a stream in the caller's format into whole events and notes what the log needs
    (see :class:`gateway.formats.openai_stream.StreamObserver`)."""

    done: bool
    errored: bool
    error_type: str | None
    finish_reason: str | None
    usage: dict[str, Any] | None

    def feed(self, chunk: bytes) -> bytes: ...

    def flush(self) -> bytes: ...


class Collector(Protocol):
    """Rebuilds a streamed answer from the events sent, for the response cache."""

    def feed(self, events: bytes) -> None: ...

    def answer(self, finish: str | None, usage: dict[str, Any] | None) -> Answer | None: ...


@dataclass(frozen=True, slots=True)
class ApiFormat:
    """One client-facing API. ``parse_request(raw, kind)``: the body checked at the door
    (raises InvalidRequest); ``error_status``/``error_type``/``error_body``/``error_event``:
    a GatewayError in this API's shape (``error_type``: the ``error.type`` its client reads,
    which the log line records); ``observer(hide_usage_chunk)``: a stream observer;
    ``failure_event(observer, error)``: the event ending a stream the upstream broke midway
    (Responses: ``response.failed``, of the response the observer saw created);
    ``answer_of(parsed_body, allow_tools)`` and ``collector()``: a cacheable Answer from a
    complete (already parsed) or streamed reply; ``answer_body(answer, id)``/``answer_events(answer, body,
    id)``: an Answer served (a cache hit); ``chat_view(body)``: the request as an
    OpenAI-chat-shaped dict (``messages`` with the system prompt first) for cache keys and
    router features; ``id_prefix``: of the ids of answers the gateway makes itself."""

    name: ApiName
    parse_request: Callable[[bytes, RequestKind], dict[str, Any]]
    error_status: Callable[[GatewayError], int]
    error_type: Callable[[GatewayError], str]
    error_body: Callable[[GatewayError], bytes]
    error_event: Callable[[GatewayError], bytes]
    observer: Callable[[bool], Observer]
    failure_event: Callable[[Observer, GatewayError], bytes]
    answer_of: Callable[[Any, bool], Answer | None]
    collector: Callable[[], Collector]
    answer_body: Callable[[Answer, str], bytes]
    answer_events: Callable[[Answer, dict[str, Any], str], bytes]
    chat_view: Callable[[dict[str, Any]], dict[str, Any]]
    id_prefix: str


def _status(error: GatewayError) -> int:
    return error.status


def _type(error: GatewayError) -> str:
    return error.type


def _openai_events(answer: Answer, body: dict[str, Any], id_: str) -> bytes:
    options = body.get("stream_options") or {}
    return openai.completion_events(answer, bool(options.get("include_usage")), id_)


def _same(body: dict[str, Any]) -> dict[str, Any]:
    return body


def _failure(render: Callable[[GatewayError], bytes]) -> Callable[[Observer, GatewayError],
                                                                  bytes]:
    def failure_event(observer: Observer, error: GatewayError) -> bytes:
        return render(error)
    return failure_event


def _responses_failure(observer: Observer, error: GatewayError) -> bytes:
    assert isinstance(observer, responses_stream.StreamObserver)
    return responses_stream.failure_event(observer, error)


OPENAI = ApiFormat(
    name="openai",
    parse_request=openai.parse_request,
    error_status=_status,
    error_type=_type,
    error_body=openai.error_body,
    error_event=openai.error_event,
    observer=StreamObserver,
    failure_event=_failure(openai.error_event),
    answer_of=openai.answer_from_completion,
    collector=openai.AnswerCollector,
    answer_body=openai.completion_body,
    answer_events=_openai_events,
    chat_view=_same,
    id_prefix="chatcmpl-cache-",
)

ANTHROPIC = ApiFormat(
    name="anthropic",
    parse_request=lambda raw, kind: anthropic.parse_request(raw),
    error_status=anthropic.error_status,
    error_type=anthropic.error_type,
    error_body=anthropic.error_body,
    error_event=anthropic.error_event,
    observer=anthropic.StreamObserver,
    failure_event=_failure(anthropic.error_event),
    answer_of=anthropic.answer_from_message,
    collector=anthropic.AnswerCollector,
    answer_body=anthropic.message_body,
    answer_events=lambda answer, body, id_: anthropic.message_events(answer, id_),
    chat_view=anthropic.chat_view,
    id_prefix="msg_cache_",
)

RESPONSES = ApiFormat(
    name="responses",
    parse_request=lambda raw, kind: responses.parse_request(raw),
    error_status=_status,
    error_type=_type,
    error_body=openai.error_body,
    error_event=responses_stream.error_event,
    observer=responses_stream.StreamObserver,
    failure_event=_responses_failure,
    answer_of=responses.answer_from_response,
    collector=responses_stream.AnswerCollector,
    answer_body=lambda answer, id_: responses.response_body(answer),
    answer_events=responses_stream.response_events,
    chat_view=responses.chat_view,
    id_prefix="chatcmpl-cache-",
)

APIS: dict[str, ApiFormat] = {"openai": OPENAI, "anthropic": ANTHROPIC, "responses": RESPONSES}
