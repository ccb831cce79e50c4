"""What a request carries through the pipeline, and what comes back out of it.

:class:`RequestContext` is made once per request by the endpoint, after the body was read
and parsed. Its ``policy`` is the snapshot taken at entry: a live reload in the middle of a
request never mixes two policies. It owns every per-request value that more than one party
uses, each computed once by one owner: the resolved model route, what the upstream
answered (usage, finish reason, which upstream, its timings), the request as OpenAI chat,
the user's text by each rule (:mod:`gateway.formats.chat_text`) and its embedding. The log
line (``record``) is filled from it once, at the end, by the endpoint; a stage writes its
own log fields there (its decision: cache layer, route tier...) and never reads the record.

:class:`Reply` is what the pipeline answers: a complete body, or an upstream stream whose
first chunk has been read. Nothing reaches the client until the pipeline returns, so a
stage may still throw a reply away and try something else (the route stage's tier fallback).
A stage that needs the end of the reply (an admission slot to release, an answer to store)
registers ``on_close``; one that needs the bytes sent registers a ``tap``.

:class:`Stage` is the shape of one step of the pipeline (``gateway/stages/``), and
:data:`Next` the rest of the pipeline after it: they live here, beside what they pass, so
that a stage imports neither the pipeline nor the table that builds it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gateway.embedding import EmbeddingMemo
from gateway.formats.apis import OPENAI, ApiFormat
from gateway.formats.chat_text import final_user_text, last_user_text
from gateway.formats.openai import RequestKind
from gateway.formats.usage import Usage
from gateway.models import ModelRoute
from gateway.requestlog import RequestRecord

if TYPE_CHECKING:
    from gateway.policy import Policy
    from gateway.tracing import RequestTrace

__all__ = ["Headers", "Next", "Outcome", "Reply", "RequestContext", "RequestKind", "Stage",
           "Stream", "Ticket", "UpstreamState", "Usage"]

Headers = list[tuple[bytes, bytes]]

_UNSET: Any = object()  # a lazily computed field not computed yet


@dataclass(frozen=True, slots=True)
class Ticket:
    """How a request queues for an admission slot: its priority class, whether it is a
    long prompt, and its tenant (see :mod:`gateway.concurrency`)."""

    priority: str = "normal"
    long: bool = False
    #: The gateway key it counts against where slots are shared between keys (its fair
    #: turn and ``per_key_share``), else None.
    tenant: str | None = None


@dataclass(frozen=True, slots=True)
class UpstreamState:
    """A Responses conversation an upstream keeps itself (OpenAI's stored responses): sent
    to ``upstream``, the request goes as the client made it (``body``, with its
    ``previous_response_id``); to any other, as the gateway rebuilt it (``ctx.body``)."""

    upstream: str
    body: dict[str, Any]


@dataclass(slots=True, eq=False)
class RequestContext:
    """One request, as the stages see it. Who sets each field, and who reads it:

    Set by the endpoint, at entry: ``kind`` and ``path`` (the endpoint, e.g. ``chat``,
    ``/chat/completions``; Anthropic's Messages is kind ``chat`` on ``/v1/messages``, with
    ``api`` ANTHROPIC); ``raw``, the body as received, and ``body``, it parsed (the compress
    stage may replace both with a compressed request); ``headers`` (the client's, lower-case
    names) and ``header_first`` (name -> its first value: made once, so that a look for a
    header most requests lack costs a dict lookup, not a pass over the headers); ``key_id`` (the gateway key's id, or None); ``request_id``; ``stream``;
    ``policy`` (the snapshot); ``record`` (the log line, written by the endpoint at the end
    and by stages for their own decisions; read by no stage); ``started`` (arrival,
    ``time.perf_counter()`` seconds); ``model``, the public model (aliases resolved) or
    router alias asked for; ``target``, the public model to serve it, and ``route``, its
    :class:`~gateway.models.ModelRoute` (None for a router alias): a stage that chooses
    another model (route, admission's reroute) sets both; compress, admission and dispatch
    read the route's targets. ``response_headers``: added to whatever answer goes out.

    Set by dispatch, read by the stages after the answer (rate-limit settlement, compression's
    learning, the cache's late hit) and by the endpoint for the log line: ``upstream`` and
    ``model_served`` (the target last tried; the cache sets ``model_served`` for a hit),
    ``upstream_started`` / ``upstream_ended`` (``perf_counter`` seconds: the first attempt,
    the last byte), ``queue_ms`` (waited for upstream slots), ``retries``. Set once by
    whoever reads the answer (dispatch for a whole one, the endpoint for a stream, the cache
    for a hit): ``usage``, ``finish_reason`` (OpenAI's vocabulary). Set by the endpoint:
    ``ttft_ms`` (arrival to the first event sent).

    Computed on first use, then kept: :attr:`chat` (the client's request as OpenAI chat),
    :attr:`semantic_query` (the cache's reading of the user's text), :attr:`last_user_text`
    (the router's), and :attr:`embeddings`, such texts' vectors.

    (Made once per request, positionally, by the endpoint alone: the fields without a
    default are its arguments, in this order.)
    """

    kind: RequestKind
    path: str
    raw: bytes
    body: dict[str, Any]
    headers: Headers
    header_first: dict[bytes, bytes]
    key_id: str | None
    request_id: str
    stream: bool
    policy: Policy
    record: RequestRecord
    started: float
    model: str
    target: str
    route: ModelRoute | None
    response_headers: Headers
    #: The client's API: its request and every answer to it are in this format.
    api: ApiFormat = OPENAI
    #: Set by admission: how the request queues for slots (None: no admission control),
    #: and the client's time-to-first-token objective (``x-gateway-ttft-slo-ms``), if any.
    ticket: Ticket | None = None
    slo_ms: float | None = None
    #: Set by a stage that will try another target when this one cannot be admitted (the
    #: route stage's tier fallback): degraded-mode actions wait until none is left.
    fallbacks_left: int = 0
    #: Set by a stage that reshapes what each upstream is sent (the prompt_cache stage):
    #: called per target with the body in the upstream's format (already translated, its
    #: ``model`` the target's) and that format's name ("openai" | "anthropic"); returns the
    #: body to send. None: the client's bytes go as they came (when nothing translates).
    shape_body: Callable[[dict[str, Any], str], dict[str, Any]] | None = None
    #: Set by a stage that can answer an overloaded request at a lower standard (the cache's
    #: relaxed semantic hit): called with the degraded label, returns a reply or None.
    degraded_answer: Callable[[str], Awaitable[Reply | None]] | None = None
    #: Set by a stage that sends something other than what the client asked (its context
    #: compressed, another model serving it): the answer is not stored as the answer to
    #: the client's request.
    lossy: bool = False
    #: Set by a stage that can make an overloaded request cheaper (the compress stage's
    #: harder cut): called with the degraded label, returns whether the request changed.
    degraded_compress: Callable[[str], Awaitable[bool]] | None = None
    #: Set by the response store before the pipeline (see :class:`UpstreamState`).
    upstream_state: UpstreamState | None = None
    #: Set by the endpoint for a stream: called by dispatch once an upstream answered 200,
    #: before its first event, with the reply's headers and the client's opening events
    #: (a translated stream's, else b""): the client's head goes out then, and those events.
    accepted: Callable[[Headers, bytes], Awaitable[None]] | None = None
    upstream: str | None = None
    model_served: str | None = None
    upstream_started: float | None = None
    upstream_ended: float | None = None
    queue_ms: float = 0.0
    retries: int = 0
    usage: Usage | None = None
    finish_reason: str | None = None
    ttft_ms: float | None = None
    #: Set by the endpoint when the request is traced (gateway.tracing): dispatch's
    #: attempts and the pipeline's stage marks go on it; no stage reads it.
    trace: RequestTrace | None = None
    _chat: dict[str, Any] | None = None
    _semantic_query: str | None = _UNSET
    _last_user_text: str | None = None
    _embeddings: EmbeddingMemo | None = None

    @property
    def embeddings(self) -> EmbeddingMemo:
        """Text -> its unit vector (all-MiniLM-L6-v2, 384 floats), each computed at most
        once, so the cache and the router pay for one embedding of the same text, even when
        they ask at once. Made on first use: most requests embed nothing."""
        memo = self._embeddings
        if memo is None:
            memo = self._embeddings = EmbeddingMemo()
        return memo

    @property
    def chat(self) -> dict[str, Any]:
        """The client's request as OpenAI chat (``api.chat_view``: the system prompt first
        among the ``messages``), for cache keys and router features. Of the request as it
        came: the stages that read it run before any stage that changes ``body`` (the stage
        table puts compress after cache and route)."""
        chat = self._chat
        if chat is None:
            chat = self._chat = self.api.chat_view(self.body)
        return chat

    @property
    def semantic_query(self) -> str | None:
        """The cache's reading: the final message's text when it is a user turn of text
        alone, else None (:func:`~gateway.formats.chat_text.final_user_text`)."""
        query = self._semantic_query
        if query is _UNSET:
            query = self._semantic_query = final_user_text(self.chat.get("messages"))
        return query

    @property
    def last_user_text(self) -> str:
        """The router's reading: the last user message's text parts, or ""
        (:func:`~gateway.formats.chat_text.last_user_text`)."""
        text = self._last_user_text
        if text is None:
            text = self._last_user_text = last_user_text(self.chat.get("messages"))
        return text


class Stream(Protocol):
    """An upstream's open event stream: ``first`` (bytes already read), ``chunks`` (the rest,
    as they arrive), ``finish()`` (read the body's tail after the last event, so the
    connection is reused), ``close(failed)`` (``failed``: the upstream broke it)."""

    first: bytes
    chunks: AsyncIterator[bytes]

    async def finish(self) -> None: ...

    def close(self, failed: bool = False) -> None: ...


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a reply ended. ``delivered``: the whole answer reached the client (a stream ended
    with ``[DONE]`` and no error event). ``upstream_failed``: the upstream broke it (dropped,
    stalled, an error event, no ``[DONE]``); a client that left is not the upstream's fault.
    """

    delivered: bool
    upstream_failed: bool = False


class Reply:
    """The pipeline's answer. ``status`` and ``headers`` (for the client, upstream's already
    filtered); then either ``body`` (complete: JSON, or a whole SSE stream when ``sse``) or
    ``stream`` (an upstream stream, relayed event by event; ``hide_usage``: drop the usage
    chunk the gateway asked for on the client's behalf). ``json``: ``body`` parsed, when
    dispatch made the reply from an upstream's whole answer (None when it is not JSON, or
    for a reply another stage made): a stage reads it rather than parse the body again."""

    __slots__ = ("_closers", "body", "headers", "hide_usage", "json", "sse", "status",
                 "stream", "taps")

    def __init__(self, status: int, headers: Headers, body: bytes = b"", *,
                 sse: bool = False, stream: Stream | None = None,
                 hide_usage: bool = False, json: Any = None) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        self.json = json
        self.sse = sse or stream is not None
        self.stream = stream
        self.hide_usage = hide_usage
        #: Called with each block of whole events sent to the client (streams only).
        self.taps: list[Callable[[bytes], None]] = []
        self._closers: list[Callable[[Outcome], None]] | None = []

    def on_close(self, closer: Callable[[Outcome], None]) -> None:
        """Call ``closer`` once, when the reply is over (sent, failed or abandoned)."""
        if self._closers is None:
            closer(Outcome(False))
        else:
            self._closers.append(closer)

    def close(self, outcome: Outcome) -> None:
        """End the reply: close the upstream stream, then run the closers (innermost stage
        first). Idempotent."""
        closers, self._closers = self._closers, None
        if closers is None:
            return
        if self.stream is not None:
            self.stream.close(outcome.upstream_failed)
        for closer in closers:
            closer(outcome)


#: The rest of the pipeline after a stage: the next stages, then dispatch.
Next = Callable[[RequestContext], Awaitable[Reply]]


class Stage(Protocol):
    """One step of the pipeline, middleware style: it may answer by itself (a cache hit, a
    shed answer), change the context before calling ``call_next`` (choose the model to
    serve), or look at the reply that comes back (store it, release a slot when it ends)."""

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply: ...
