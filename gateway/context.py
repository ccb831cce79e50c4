"""What a request carries through the pipeline, and what comes back out of it.

:class:`RequestContext` is made once per request by the endpoint, after the body was read
and parsed: stages read it, and write only what they own (the record's fields, response
headers, the model to serve). Its ``policy`` is the snapshot taken at entry: a live reload
in the middle of a request never mixes two policies.

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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from gateway.embedding import EmbeddingMemo
from gateway.formats.apis import OPENAI, ApiFormat
from gateway.formats.openai import RequestKind
from gateway.requestlog import RequestRecord

if TYPE_CHECKING:
    from gateway.policy import Policy

__all__ = ["Headers", "Memo", "Next", "Outcome", "Reply", "RequestContext", "RequestKind",
           "Stage", "Stream", "Ticket"]

Headers = list[tuple[bytes, bytes]]


@dataclass(frozen=True, slots=True)
class Ticket:
    """How a request queues for an admission slot: its priority class and whether it is a
    long prompt (see :mod:`gateway.concurrency`)."""

    priority: str = "normal"
    long: bool = False


@dataclass(slots=True)
class Memo:
    """Values derived from the request that several stages use, computed at most once.

    ``embeddings``: text -> its unit vector (all-MiniLM-L6-v2, 384 floats), so the cache and
    the router pay for one embedding of the same text, even when they ask at once.
    """

    embeddings: EmbeddingMemo = field(default_factory=EmbeddingMemo)


@dataclass(slots=True, eq=False)
class RequestContext:
    """One request, as the stages see it.

    ``kind`` and ``path``: the endpoint (e.g. ``chat``, ``/chat/completions``; Anthropic's
    Messages is kind ``chat`` on ``/v1/messages``, with ``api`` ANTHROPIC); ``raw``: the
    body as received (bytes); ``body``: it parsed; ``headers``: the client's (lower-case
    names); ``key_id``: the gateway key's id, or None; ``policy``: the snapshot taken at
    entry; ``record``: the log line's fields; ``model``: the public model (aliases resolved)
    or router alias asked for; ``target``: the public model to serve it (a stage may choose
    another); ``response_headers``: added to whatever answer goes out.
    """

    kind: RequestKind
    path: str
    raw: bytes
    body: dict[str, Any]
    headers: Headers
    key_id: str | None
    policy: Policy
    record: RequestRecord
    model: str
    target: str
    response_headers: Headers
    memo: Memo = field(default_factory=Memo)
    #: The client's API: its request and every answer to it are in this format.
    api: ApiFormat = OPENAI
    #: Set by admission: how the request queues for slots (None: no admission control).
    ticket: Ticket | None = None
    #: Set by a stage that will try another target when this one cannot be admitted (the
    #: route stage's tier fallback): degraded-mode actions wait until none is left.
    fallbacks_left: int = 0
    #: Set by a stage that reshapes what each upstream is sent (the prompt_cache stage):
    #: called per attempt with the body in the upstream's format (already translated, its
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

    @property
    def stream(self) -> bool:
        return self.record.stream


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
    chunk the gateway asked for on the client's behalf)."""

    __slots__ = ("_closers", "body", "headers", "hide_usage", "sse", "status", "stream",
                 "taps")

    def __init__(self, status: int, headers: Headers, body: bytes = b"", *,
                 sse: bool = False, stream: Stream | None = None,
                 hide_usage: bool = False) -> None:
        self.status = status
        self.headers = headers
        self.body = body
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
