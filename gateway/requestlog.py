"""One structured JSON line per request: the record, its schema and where it goes.

Schema (stable; new fields are only ever added). Times are milliseconds, tokens are counts:

=================  =====================================================================
request_id         taken from the client's ``x-request-id`` or made; returned in the response
ts                 request arrival, ISO 8601 UTC
route              the endpoint's route, e.g. ``/v1/chat/completions``, ``passthrough``, or
                   ``unknown`` (a path or method no route serves: gateway.unserved)
api                the client's API: ``openai``, ``anthropic`` (``/v1/messages``) or
                   ``responses`` (``/v1/responses``)
key_id             the gateway key's id (never the key), or null
model_requested    ``model`` as the client sent it
model_served       the upstream model id that answered
upstream           the upstream's name
status             HTTP status returned to the client
stream             whether the client asked for SSE
ttft_ms            streaming: arrival -> first event forwarded
queue_ms           time queued for an admission slot (0 when admitted at once)
total_ms           arrival -> last byte sent
upstream_ms        first upstream attempt -> last upstream byte (retries included)
overhead_ms        total_ms - upstream_ms: what the gateway itself added
prompt_tokens, completion_tokens, cached_tokens   from the upstream's usage (prompt_tokens
                   counts all input, cached prompt tokens included, whatever the API)
cache_read_tokens  prompt tokens read from the provider's prompt cache (= cached_tokens)
cache_write_tokens prompt tokens written to it (Anthropic reports them; OpenAI does not: null)
prompt_cache_breakpoints
                   cache markers the ``prompt_cache`` stage added (Anthropic upstreams; 0
                   for others); null when the stage is off
prompt_cache_moved volatile lines the stage moved to the end of the request, counted by
                   kind (timestamp, id, custom, changed), e.g. ``{"timestamp": 1}``
                   (never their text); null
                   when the stage is off
finish_reason      from the last choice, in OpenAI's terms (Anthropic's ``stop_reason``
                   mapped: end_turn -> stop, max_tokens -> length, tool_use -> tool_calls)
retries            attempts beyond the first, across fallback targets
cancelled          the client went away before the response was complete
error_type         the ``error.type`` the client was sent when the request failed, in its
                   API's terms (Anthropic's on ``/v1/messages``: ``not_found_error``,
                   ``overloaded_error``...; OpenAI's elsewhere), or an upstream's error
                   event's; else null
error_code         OpenAI ``error.code`` when the request failed, else null
shed               degraded-mode reason (shed or rerouted), else null
cache, route_tier, route_score   filled by pipeline stages (null when off)
cache              ``hit``, ``miss`` or ``bypass`` (null when the cache is off)
cache_layer        ``exact`` or ``semantic`` on a hit
similarity         cosine similarity of the best semantic candidate
verified           the verifier's score of the served (or best rejected) candidate
lookup_ms          time spent in the cache lookup (embedding included); null when the
                   lookup outlived the upstream's answer (past ``cache.lookup_budget_ms``)
late_hit           a semantic hit found past the lookup budget, while the upstream call ran:
                   ``served`` (the call cancelled), ``ignored`` (its upstream may bill a
                   cancelled call: the upstream's answer served), ``too_late`` (the upstream
                   had answered first); else null
router             the router that chose the tier (the requested alias), else null
route_tier         the tier the router chose
route_score        the router's score, P(strong tier needed); null without an embedding
route_threshold    the score at or above which the strong tier is chosen
route_fallback     the tier that served instead, when the chosen tier failed or shed
route_ms           time spent deciding (embedding included when the cache had none)
route_sticky       true when the conversation was kept on its tier unscored
policy_version     the ``version`` of the policy snapshot the request was served under
compression        the ``compress`` stage's achieved ratio (tokens before / after) when it
                   compressed, else null
tokens_before      tokens of the context it compressed, before and after, in the target
tokens_after       upstream's tokenizer (null when it did not run the compressor)
compress_ms        the compressor's time (ms)
compress_skip      why the stage did not compress: ``client_off``, ``short``,
                   ``nothing_to_compress``, ``no_prefill_rate``, ``not_worth_it``,
                   ``no_gain``, ``error``; null when it compressed or is off
compress_fine      what the fine pass (``token_level``) did when asked: ``applied``,
                   ``unneeded``, ``no_room`` (too little prose), ``error`` (scoring failed:
                   coarse alone), ``no_engine`` (no local engine ready), ``not_worth_it``
                   (the gate allowed coarse alone), ``degraded``; null when not asked
rate_limit         which limiter decided the request's rate limits: ``redis`` (shared by
                   replicas), ``local`` (no Redis configured), ``fallback`` (Redis down or
                   slow: this process decided alone); null when no limit applies
rate_limited       the limit that refused it (429): ``requests`` or ``tokens``, else null
coalesced          ``leader``: identical requests shared its upstream call; ``follower``: it
                   shared another's (the ``coalesce`` stage); else null
hedged             a hedge was sent (the first call slow to answer: ``[balance]
                   hedge_after_ms``); ``upstream`` is then the one that answered first
path               a pass-through or unserved request's path (its ``route`` is
                   ``passthrough`` or ``unknown``), in its canonical form (gateway.paths), at
                   most 256 characters; else null
dropped_tools      a Responses request's hosted tools left out of what a translated upstream
                   was offered (``[translation] hosted_tools = "drop"``), by type, each once
                   (e.g. ``["web_search"]``: from the known set,
                   gateway.formats.responses_tools.HOSTED_TOOLS); else null
first_token_timeouts
                   streamed attempts cut by the first-token deadline (``[stream_watch]``),
                   each then retried or failed over; 0
stalled            the stream stalled once answering (gateway.stream_watch): ``idle`` (no
                   event but pings for ``stream_idle_timeout_ms``) or ``slow`` (under
                   ``min_tokens_per_s``); it ended with an error event; else null
continued          times the stream was continued on another attempt after it broke,
                   stalled or sent an error event once answering (gateway.continuation); 0
trace_id, span_id  the request's trace and its server span (lowercase hex), only on the line
                   of a request that was traced (``[tracing]``, gateway.tracing)
=================  =====================================================================

Prompt and completion text and keys are never logged.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import orjson
import structlog

__all__ = ["FIELDS", "FLUSH_INTERVAL_S", "MAX_BUFFERED_BYTES", "RequestIds", "RequestLogger",
           "RequestRecord", "configure_logging"]

#: How often buffered request lines are flushed to stdout (s).
FLUSH_INTERVAL_S = 0.2
#: Buffered request lines are flushed at once past this size (bytes).
MAX_BUFFERED_BYTES = 64 * 1024

FIELDS = (
    "request_id", "ts", "route", "key_id", "model_requested", "model_served", "upstream",
    "status", "stream", "ttft_ms", "queue_ms", "total_ms", "upstream_ms", "overhead_ms",
    "prompt_tokens",
    "completion_tokens", "cached_tokens", "finish_reason", "retries", "cancelled",
    "error_type", "error_code", "cache", "route_tier", "route_score", "compression", "shed",
    "cache_layer", "similarity", "verified", "lookup_ms", "router", "route_threshold",
    "route_fallback", "route_ms", "route_sticky", "policy_version", "api", "cache_read_tokens",
    "cache_write_tokens", "prompt_cache_breakpoints", "prompt_cache_moved", "tokens_before",
    "tokens_after", "compress_ms", "compress_skip", "rate_limit", "rate_limited", "late_hit",
    "compress_fine", "coalesced", "hedged", "path", "dropped_tools",
    "first_token_timeouts", "stalled", "continued",  # issue 48: gateway.stream_watch
)




@functools.lru_cache(maxsize=4)
def _iso_second(second: int) -> str:
    return datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S")


#: ".000+00:00" to ".999+00:00": a time's milliseconds and zone, written once.
_MS_ZONE = tuple(f".{ms:03d}+00:00" for ms in range(1000))


def _iso(ts: float) -> str:
    """ISO 8601 UTC with milliseconds; the date part is formatted once per second, the
    rest taken from a table."""
    second = int(ts)
    return _iso_second(second) + _MS_ZONE[int((ts - second) * 1000)]


class RequestRecord:
    """Mutable per-request facts, emitted once. The endpoint fills it (from the request's
    context, at the end, for what the context owns: upstream, timings, usage...); a stage
    writes only its own decision fields (``cache``, ``route_tier``...); nothing on the
    request path reads it back.

    The record's own dict is the log line: a copy of the defaults (:data:`FIELDS`, in order)
    made at the start, each field set in its place; the internal timers (``started``, the
    upstream's start and end, arrival as a POSIX time) and the metric label are slots,
    outside it. The class-level values below are the defaults (and the fields' types).
    """

    __slots__ = ("__dict__", "_arrived", "model_label", "started", "upstream_ended",
                 "upstream_started")

    upstream_started: float | None
    upstream_ended: float | None
    #: Not logged: the ``model`` metric label when it is not ``model_served`` (an id a
    #: pattern entry resolved counts under the pattern's name: gateway.models).
    model_label: str | None
    key_id: str | None = None
    model_requested: str | None = None
    model_served: str | None = None
    upstream: str | None = None
    ttft_ms: float | None = None
    queue_ms: float = 0.0
    total_ms: float | None = None
    upstream_ms: float | None = None
    overhead_ms: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    prompt_cache_breakpoints: int | None = None
    prompt_cache_moved: dict[str, int] | None = None
    api: str = "openai"
    finish_reason: str | None = None
    error_type: str | None = None
    error_code: str | None = None
    cache: str | None = None
    cache_layer: str | None = None
    similarity: float | None = None
    verified: float | None = None
    lookup_ms: float | None = None
    late_hit: str | None = None
    route_tier: str | None = None
    route_score: float | None = None
    router: str | None = None
    route_threshold: float | None = None
    route_fallback: str | None = None
    route_ms: float | None = None
    route_sticky: bool | None = None
    policy_version: str | None = None
    compression: float | None = None
    tokens_before: int | None = None
    tokens_after: int | None = None
    compress_ms: float | None = None
    compress_skip: str | None = None
    compress_fine: str | None = None
    rate_limit: str | None = None
    rate_limited: str | None = None
    coalesced: str | None = None
    hedged: bool = False
    path: str | None = None
    dropped_tools: list[str] | None = None
    first_token_timeouts: int = 0
    stalled: str | None = None
    continued: int = 0
    shed: str | None = None
    retries: int = 0
    cancelled: bool = False
    status: int = 0

    def __init__(self, request_id: str, route: str, stream: bool = False):
        self.__dict__ = _DEFAULTS.copy()
        self.started = time.perf_counter()
        self.upstream_started = self.upstream_ended = self.model_label = None
        self.request_id = request_id
        self._arrived = time.time()
        self.route = route
        self.stream = stream

    def finish(self) -> None:
        now = time.perf_counter()
        total = (now - self.started) * 1000
        self.total_ms = round(total, 3)
        if self.upstream_started is not None:
            upstream = ((self.upstream_ended or now) - self.upstream_started) * 1000
            self.upstream_ms = round(upstream, 3)
            self.overhead_ms = round(total - upstream, 3)
        else:
            self.overhead_ms = self.total_ms

    def as_dict(self) -> dict[str, Any]:
        """The log line's fields, in FIELDS order: the record's own dict (not a copy: the
        record is done), ``ts`` written into it now."""
        out = self.__dict__
        out["ts"] = _iso(self._arrived)
        return out



_DEFAULTS: dict[str, Any] = {name: getattr(RequestRecord, name, None) for name in FIELDS}


class RequestIds:
    """Makes request ids: a random 64-bit prefix per process plus a counter, 32 hex digits
    (unique across replicas in practice, and ~10x cheaper than uuid4, which reads the OS
    random source every time)."""

    def __init__(self) -> None:
        self._prefix = os.urandom(8).hex()
        self._counter = itertools.count(1)

    def __call__(self) -> str:
        return f"{self._prefix}{next(self._counter):016x}"


class RequestLogger:
    """Emits finished records. ``sink`` receives each record as a dict (tests pass a list's
    ``append``); by default the line goes to stdout as event ``request``, beside structlog's
    own lines."""

    def __init__(self, sink: Callable[[dict[str, Any]], None] | None = None, enabled: bool = True):
        # The record is complete and flat and carries its own ts: it needs none of structlog's
        # processors, so it is rendered by orjson and kept in this logger's own buffer, which
        # flush() writes to stdout in one call (the app calls it every FLUSH_INTERVAL_S), not
        # one syscall per request. Its own buffer, not stdout's: with PYTHONUNBUFFERED=1 (the
        # container image sets it) stdout's binary layer writes through on every call.
        self._out = sys.stdout.buffer
        self._lines: list[bytes] = []
        self._size = 0
        self._sink = sink
        self.enabled = enabled

    def flush(self) -> None:
        if self._lines:
            block = b"".join(self._lines)
            self._lines.clear()
            self._size = 0
            self._out.write(block)
        self._out.flush()

    def emit(self, record: RequestRecord) -> None:
        if not self.enabled and self._sink is None:
            return
        fields = record.as_dict()
        if self._sink is not None:
            self._sink(fields)
        if self.enabled:
            fields["event"] = "request"
            line = orjson.dumps(fields, option=orjson.OPT_APPEND_NEWLINE)
            self._lines.append(line)
            self._size += len(line)
            if self._size >= MAX_BUFFERED_BYTES:
                self.flush()


def configure_logging(level: str = "info") -> None:
    """JSON lines on stdout through structlog + orjson (called once by the CLI)."""
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True, key="logged_at"),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(serializer=orjson.dumps),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.BytesLoggerFactory(file=sys.stdout.buffer),
        cache_logger_on_first_use=True,
    )
