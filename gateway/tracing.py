"""OpenTelemetry traces of the request path (issue 49): the one module that owns the tracer.

Off by default (``[tracing]``, :mod:`gateway.tracing_config`): then nothing of OpenTelemetry
is imported, ``Gateway.tracing`` is None and a request pays one ``is None`` test. On, it
is the OpenTelemetry SDK with its OTLP/HTTP exporter behind the batch span processor (a
bounded queue exported from its own thread: export never blocks the event loop, and an
unreachable collector costs dropped spans, counted in /metrics, never requests).

Spans follow the OpenTelemetry semantic conventions 1.44.0 (GenAI spans, development
status; https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans/):

- the request: a SERVER span ``{gen_ai.operation.name} {gen_ai.request.model}``, a child
  of the client's ``traceparent`` when it sent one, from arrival to its last byte sent (or
  the client leaving: ``llm_gateway.cancelled``), its attributes filled once at the end
  from the request's record (:mod:`gateway.trace_attributes`), the first event sent as a
  ``first_token`` event;
- each pipeline stage that ran: an INTERNAL span from its start to its handing on (or its
  own answer), named after the stage (gateway.pipeline times them only when tracing is on);
- each upstream attempt: a CLIENT span ``{operation} {target model}`` (retries, hedges,
  fallbacks, continuations: ``llm_gateway.attempt.reason``), until its answer, or for a
  stream until the stream ends, with its outcome. Its context goes upstream as the
  request's ``traceparent`` (:data:`OUTGOING`, read by gateway.upstreams.openai), so the
  local engine's spans (queue, prefill, decode) sit under it.

Stages record what they decided on the context and the record, never on spans: no stage
imports this module.
"""

from __future__ import annotations

import asyncio
import contextvars
import re
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from gateway.errors import FirstTokenTimeout, UpstreamTimeout
from gateway.trace_attributes import (
    OPERATIONS,
    content_attributes,
    request_attributes,
    stage_attributes,
)
from gateway.trace_export import SpanCounts, counting_parts
from gateway.tracing_config import TracingConfig
from gateway.upstreams.base import WholeResponse

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from gateway.model_config import Target
    from gateway.requestlog import RequestRecord
    from gateway.upstreams.base import Upstream

__all__ = ["OUTGOING", "SCHEMA_URL", "RequestTrace", "Tracing", "as_continuation", "as_hedge"]

SCHEMA_URL = "https://opentelemetry.io/schemas/1.44.0"

#: The trace context headers of the upstream attempt under way in this task (``traceparent``,
#: ``tracestate``), which the upstream request carries instead of the client's; None when
#: the request is not traced. A context variable: a hedge's attempt runs in its own task.
OUTGOING: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "gateway_trace_outgoing", default=None)
#: Why the next attempt of this task's dispatch is made, when its caller knows better than
#: the attempt order: "hedge" (gateway.hedge's second call), "continuation".
_REASON: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "gateway_trace_reason", default=None)

#: The span of the upstream attempt under way in this task, for what an upstream learns
#: while sending (a replica pool's choice: :func:`note_replica`).
_ATTEMPT: contextvars.ContextVar[Span | None] = contextvars.ContextVar(
    "gateway_trace_attempt", default=None)

R = TypeVar("R")


def note_replica(replica: str, why: str) -> None:
    """A replica pool chose ``replica`` (its URL) for the attempt under way, because ``why``
    (the pool's routing: ``prefix_match``, ``least_load``, ``imbalance``, ``round_robin``;
    ``next_after_unreachable``); nothing when the request is not traced."""
    span = _ATTEMPT.get()
    if span is not None:
        span.set_attributes({"llm_gateway.replica": replica, "llm_gateway.replica.reason": why})

#: The first ``"id"`` of a stream's opening event (OpenAI's chunk, Anthropic's message,
#: a Responses ``response``), at most 200 bytes long.
_ID = re.compile(rb'"id"\s*:\s*"([^"\\]{1,200})"')


async def as_hedge(call: Awaitable[R]) -> R:
    """``call``, its attempts traced as a hedge's (it runs in the hedge's own task)."""
    _REASON.set("hedge")
    return await call


async def as_continuation(call: Awaitable[R]) -> R:
    """``call``, its attempts traced as a stream's continuation."""
    token = _REASON.set("continuation")
    try:
        return await call
    finally:
        _REASON.reset(token)


class Tracing:
    """The gateway's tracer provider, sampler, exporter and propagator (one per gateway,
    none global). ``start`` opens a request's trace."""

    def __init__(self, config: TracingConfig) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        from opentelemetry.trace import SpanKind, set_span_in_context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.config = config
        self.counts = SpanCounts()
        exporter_type, processor_type = counting_parts(self.counts, config.max_queue_size)
        exporter = exporter_type(OTLPSpanExporter(
            endpoint=config.endpoint, headers=config.headers or None,
            timeout=config.export_timeout_ms / 1000))
        self._processor = processor_type(BatchSpanProcessor(
            exporter, max_queue_size=config.max_queue_size,
            schedule_delay_millis=config.export_interval_ms,
            max_export_batch_size=min(512, config.max_queue_size),
            export_timeout_millis=config.export_timeout_ms))
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": config.service}),
            sampler=ParentBased(TraceIdRatioBased(config.ratio)))
        self.provider.add_span_processor(self._processor)
        self.tracer = self.provider.get_tracer("llm-gateway", schema_url=SCHEMA_URL)
        self.propagator = TraceContextTextMapPropagator()
        self.server, self.client, self.internal = SpanKind.SERVER, SpanKind.CLIENT, \
            SpanKind.INTERNAL
        self.in_context = set_span_in_context
        #: perf_counter seconds -> Unix ns (the record's clock to the spans').
        self.offset_ns = time.time_ns() - int(time.perf_counter() * 1e9)
        self._servers: dict[str, tuple[str, int | None]] = {}

    def ns(self, perf: float) -> int:
        return self.offset_ns + int(perf * 1e9)

    def start(self, first: dict[bytes, bytes], started: float, route: str) -> RequestTrace | None:
        """The request's SERVER span, begun at ``started`` (perf_counter s), a child of the
        client's ``traceparent`` (``first``: each header's first value); None when it is
        not sampled (the client's own trace context then goes upstream as it came)."""
        parent = None
        traceparent = first.get(b"traceparent")
        if traceparent is not None:
            carrier = {"traceparent": traceparent.decode("latin-1")}
            state = first.get(b"tracestate")
            if state is not None:
                carrier["tracestate"] = state.decode("latin-1")
            parent = self.propagator.extract(carrier)
        span = self.tracer.start_span(route, context=parent, kind=self.server,
                                      start_time=self.ns(started))
        if not span.is_recording():
            return None
        return RequestTrace(self, span)

    def server_of(self, upstream: Upstream) -> tuple[str, int | None]:
        """``server.address`` and ``server.port`` of an upstream (from its base URL)."""
        known = self._servers.get(upstream.name)
        if known is None:
            url = urlsplit(str(getattr(upstream, "base_url", "") or ""))
            known = self._servers[upstream.name] = (url.hostname or upstream.name, url.port)
        return known

    def engine_env(self) -> dict[str, str]:
        """The environment a local engine this gateway starts traces with (its own
        ``--tracing``; local_engine.tracing): the same collector, sampler and export
        interval, its service name this one's + "-engine"."""
        config, env = self.config, {"OTEL_SERVICE_NAME": self.config.service + "-engine",
                                    "OTEL_BSP_SCHEDULE_DELAY": str(self.config.export_interval_ms)}
        if config.endpoint:
            env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = config.endpoint
        if config.headers:
            env["OTEL_EXPORTER_OTLP_TRACES_HEADERS"] = ",".join(
                f"{k}={v}" for k, v in config.headers.items())
        env["OTEL_TRACES_SAMPLER"] = "parentbased_traceidratio"
        env["OTEL_TRACES_SAMPLER_ARG"] = str(config.ratio)
        return env

    def force_flush(self, timeout_ms: int = 5000) -> bool:
        return self.provider.force_flush(timeout_ms)

    def shutdown(self) -> None:
        """Export what is queued (within the export timeout), then stop."""
        self.provider.shutdown()


class RequestTrace:
    """One request's trace: its SERVER span (open from arrival), the stages' marks and the
    attempts' spans. Lives on the context (``ctx.trace``) while the request runs."""

    __slots__ = ("attempts", "last", "output", "provider", "response_id", "span", "stages",
                 "tracing")

    def __init__(self, tracing: Tracing, span: Span) -> None:
        self.tracing = tracing
        self.span = span
        #: (stage name, start, end) in perf_counter s; end None until it hands on.
        self.stages: list[list[Any]] = []
        self.attempts = 0
        self.last: tuple[str, str] | None = None  # the last attempt's (upstream, model)
        self.response_id: str | None = None
        self.provider: str | None = None  # of the attempt that answered last
        self.output: Any = None  # a whole answer's JSON, kept for capture_content

    def answered(self, answer: Any) -> None:
        """The answer going out: a whole one's JSON (or bytes: an SSE body), or a stream's
        first upstream chunk; its id is the span's ``gen_ai.response.id``."""
        if isinstance(answer, dict):
            found = answer.get("id")
            self.response_id = found if isinstance(found, str) else None
            if self.tracing.config.capture_content:
                self.output = answer
        elif isinstance(answer, bytes):
            match = _ID.search(answer)
            if match is not None:
                self.response_id = match.group(1).decode("ascii", "replace")

    @property
    def ids(self) -> tuple[str, str]:
        """(trace id, span id) of the request's span, in lowercase hex."""
        context = self.span.get_span_context()
        return f"{context.trace_id:032x}", f"{context.span_id:016x}"

    # --- stages (gateway.pipeline) ---

    def stage_started(self, name: str) -> list[Any]:
        mark = [name, time.perf_counter(), None]
        self.stages.append(mark)
        return mark

    @staticmethod
    def stage_ended(mark: list[Any]) -> None:
        if mark[2] is None:
            mark[2] = time.perf_counter()

    # --- upstream attempts (gateway.dispatch) ---

    def traced(self, attempt: Callable[[Upstream, Target], Awaitable[R]],
               kind: str) -> Callable[[Upstream, Target], Awaitable[R]]:
        """``attempt`` with a CLIENT span around each call, whose context the upstream
        request carries (:data:`OUTGOING`). A stream's span is handed to its result
        (``result.span``) and ends with the stream (:func:`end_stream`)."""
        tracing, operation = self.tracing, OPERATIONS.get(kind, "chat")
        first_of_run = True

        async def run(upstream: Upstream, target: Target) -> R:
            nonlocal first_of_run
            reason = _REASON.get() if first_of_run else None
            first_of_run = False
            here = (upstream.name, target.model)
            if reason is None:
                reason = "first" if self.last is None else \
                    "retry" if self.last == here else "fallback"
            self.last = here
            self.attempts += 1
            address, port = tracing.server_of(upstream)
            attributes: dict[str, Any] = {
                "gen_ai.operation.name": operation, "gen_ai.provider.name": upstream.provider,
                "gen_ai.request.model": target.model, "server.address": address,
                "llm_gateway.upstream": upstream.name, "llm_gateway.attempt": self.attempts,
                "llm_gateway.attempt.reason": reason}
            if port is not None:
                attributes["server.port"] = port
            span = tracing.tracer.start_span(
                f"{operation} {target.model}", context=tracing.in_context(self.span),
                kind=tracing.client, attributes=attributes)
            headers: dict[str, str] = {}
            tracing.propagator.inject(headers, context=tracing.in_context(span))
            token, current = OUTGOING.set(headers), _ATTEMPT.set(span)
            try:
                result = await attempt(upstream, target)
            except BaseException as exc:
                _failed(span, exc)
                raise
            finally:
                OUTGOING.reset(token)
                _ATTEMPT.reset(current)
            status: int = result.status  # type: ignore[attr-defined]
            self.provider = upstream.provider
            span.set_attribute("http.response.status_code", status)
            if status != 200:
                _end(span, "status", str(status))
            elif isinstance(result, WholeResponse):
                _end(span, "ok")
            else:
                result.span = span  # type: ignore[attr-defined]
            return result

        return run

    # --- the end (gateway.endpoint) ---

    def end(self, rec: RequestRecord, ctx: Any) -> None:
        """Fill and end the request's span and its stages' spans, from the finished
        record ``rec`` and the context ``ctx`` (None when the request failed before it
        had one). Writes ``trace_id`` and ``span_id`` into the log line."""
        tracing, span = self.tracing, self.span
        body = ctx.body if ctx is not None else None
        operation = OPERATIONS.get(ctx.kind, "chat") if ctx is not None else "chat"
        attributes = request_attributes(rec, body, operation, self.response_id)
        # the provider that answered; the gateway itself for what no upstream did (a hit)
        attributes["gen_ai.provider.name"] = self.provider or "llm_gateway"
        if tracing.config.capture_content and ctx is not None:
            attributes.update(content_attributes(ctx, self.output))
        context = tracing.in_context(span)
        for name, start, end in self.stages:
            decided = stage_attributes(name, rec)
            if decided is not None:
                tracing.tracer.start_span(
                    name, context=context, kind=tracing.internal, attributes=decided,
                    start_time=tracing.ns(start)).end(tracing.ns(end or start))
        if rec.ttft_ms is not None:
            span.add_event("first_token", timestamp=tracing.ns(
                rec.started + rec.ttft_ms / 1000))
        if rec.cancelled:
            span.add_event("cancel")
        model = rec.model_requested
        span.update_name(f"{operation} {model}" if model else rec.route)
        span.set_attributes(attributes)
        if rec.status >= 500:
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, rec.error_type or str(rec.status)))
        span.end(tracing.ns(rec.started + (rec.total_ms or 0.0) / 1000))
        rec.__dict__["trace_id"], rec.__dict__["span_id"] = self.ids


def _end(span: Span, outcome: str, error: str | None = None) -> None:
    span.set_attribute("llm_gateway.attempt.outcome", outcome)
    if error is not None:
        from opentelemetry.trace import Status, StatusCode

        span.set_attribute("error.type", error)
        span.set_status(Status(StatusCode.ERROR, error))
    span.end()


def _failed(span: Span, exc: BaseException) -> None:
    """An attempt that raised: a first-token deadline, a timeout, an upstream error, or
    cancelled (the hedge it lost, the client gone)."""
    if isinstance(exc, asyncio.CancelledError):
        _end(span, "cancelled")
    elif isinstance(exc, FirstTokenTimeout):
        _end(span, "first_token_timeout", type(exc).__name__)
    elif isinstance(exc, UpstreamTimeout):
        _end(span, "timeout", type(exc).__name__)
    else:
        _end(span, "error", type(exc).__name__)


def end_stream(span: Span, failed: bool) -> None:
    """The end of a streamed attempt's span: the upstream's stream over, whole or broken."""
    if failed:
        _end(span, "broken", "stream_broken")
    else:
        _end(span, "ok")
