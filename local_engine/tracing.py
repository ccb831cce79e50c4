"""The engine's OpenTelemetry tracer: spans under the W3C trace context a request carries.

Off by default (``--tracing`` turns it on): off, nothing of OpenTelemetry is imported and a
request pays one ``is None`` check. On, the server reads ``traceparent``/``tracestate``
(W3C Trace Context) from a chat or completions request and each request's spans are made
*after the fact*, when its sequence finishes or is aborted, from the ``perf_counter`` stamps
and plain int counters the step loop keeps on the :class:`~local_engine.sequence.Sequence`
(the per-step path creates no span). A request gives

- a SERVER span ``{gen_ai.operation.name} {gen_ai.request.model}`` ("chat" for
  /v1/chat/completions, "text_completion" for scoring on /v1/completions), from the
  request's arrival at the server to its end, child of the extracted parent, with
  ``gen_ai.operation.name``, ``gen_ai.request.model``, ``gen_ai.response.model``,
  ``gen_ai.response.id``, ``gen_ai.request.max_tokens``/``temperature``/``top_p`` (the
  values the engine applied), ``gen_ai.usage.input_tokens``/``output_tokens``/
  ``cache_read.input_tokens``, ``gen_ai.response.finish_reasons``, and
  ``local_engine.prefix_cache.hit_tokens``, ``local_engine.cancelled``,
  ``local_engine.preemptions``; its end as an event, ``finish`` (with
  ``local_engine.finish_reason``) or ``cancel``; an engine error sets status ERROR and
  ``error.type``;
- INTERNAL children for the phases that happened: ``queue`` (arrival in the engine to
  admission), ``prefill`` (admission to the first token: ``local_engine.prefill.chunks``,
  ``local_engine.prefill.tokens``, ``local_engine.prefix_cache.hit_tokens``) and ``decode``
  (first token to the end: ``local_engine.decode.steps``, and where speculative decoding
  ran ``local_engine.speculative.draft_tokens``/``accepted_tokens``).

Attribute names follow the OpenTelemetry semantic conventions 1.44.0, GenAI spans
(development status); the engine's own attributes are under ``local_engine.``.

Export: the SDK's TracerProvider (service name from ``OTEL_SERVICE_NAME``, else
"local-engine"; its default sampler, which reads ``OTEL_TRACES_SAMPLER``/``_ARG`` and is
parent-based always-on, so an unsampled ``traceparent`` records nothing) with a
BatchSpanProcessor over the OTLP/HTTP exporter, which reads
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``/``OTEL_EXPORTER_OTLP_ENDPOINT`` and ``*_HEADERS``
itself. The processor's own thread exports (never the event loop nor the engine thread);
its queue is bounded (``OTEL_BSP_MAX_QUEUE_SIZE``), so an unreachable collector drops spans.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from local_engine.sequence import Sequence

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

__all__ = ["EngineTracer", "TraceInfo", "make_tracer"]

_SCOPE = "local_engine"


@dataclass(eq=False)
class TraceInfo:
    """What the server knows of a traced request: the extracted parent context, the
    operation ("chat", "text_completion"), the requested model, the response id, the
    ``perf_counter`` second the request arrived (the server span's start) and, for a
    request that makes no sequence (scoring), its input tokens."""

    parent: Context
    start: float
    operation: str = "chat"
    model: str = ""
    response_id: str = ""
    input_tokens: int = 0


class EngineTracer:
    """Made by :func:`make_tracer` (on); ``begin`` on the event loop, the ``*_span``
    methods on whichever thread saw the end (the engine thread for generation)."""

    def __init__(self, provider: TracerProvider, response_model: str = "") -> None:
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind, Status, StatusCode
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.response_model = response_model
        self._tracer: Tracer = provider.get_tracer(_SCOPE)
        self._propagator = TraceContextTextMapPropagator()
        self._in = trace.set_span_in_context
        self._server, self._internal = SpanKind.SERVER, SpanKind.INTERNAL
        self._status, self._error = Status, StatusCode.ERROR
        # perf_counter seconds -> ns since the epoch: one offset, taken once
        self._offset = time.time_ns() - int(time.perf_counter() * 1e9)

    def _ns(self, t: float) -> int:
        return self._offset + int(t * 1e9)

    def begin(self, headers: Mapping[str, str], operation: str) -> TraceInfo:
        """The request's parent context from its ``traceparent``/``tracestate`` headers
        (an empty context, a new trace, without them)."""
        return TraceInfo(self._propagator.extract(headers), time.perf_counter(), operation)

    def _server_span(self, info: TraceInfo, attributes: dict[str, Any]) -> Span:
        attributes.update({"gen_ai.operation.name": info.operation,
                           "gen_ai.request.model": info.model,
                           "gen_ai.response.model": self.response_model})
        if info.response_id:
            attributes["gen_ai.response.id"] = info.response_id
        return self._tracer.start_span(f"{info.operation} {info.model}", info.parent,
                                       self._server, attributes,
                                       start_time=self._ns(info.start))

    def _end(self, span: Span, end: int, cancelled: bool, error: BaseException | None,
             reason: str | None) -> None:
        if error is not None:
            span.set_attribute("error.type", type(error).__qualname__)
            span.set_status(self._status(self._error, str(error)))
        elif cancelled:
            span.add_event("cancel", timestamp=end)
        else:
            span.add_event("finish", {"local_engine.finish_reason": reason} if reason else None,
                           end)
        span.end(end)

    def sequence_span(self, seq: Sequence, end: float, cancelled: bool = False,
                      error: BaseException | None = None) -> None:
        """The spans of ``seq`` (whose ``trace`` is a TraceInfo), ended at ``end``
        (perf_counter s): finished, ``cancelled`` by its client, or failed with ``error``."""
        info: TraceInfo = seq.trace
        p = seq.params
        done = not cancelled and error is None
        server = self._server_span(info, {
            "gen_ai.request.max_tokens": p.max_tokens,
            "gen_ai.request.temperature": p.temperature, "gen_ai.request.top_p": p.top_p,
            "gen_ai.usage.input_tokens": len(seq.prompt_ids),
            "gen_ai.usage.output_tokens": len(seq.output_ids),
            "gen_ai.usage.cache_read.input_tokens": seq.num_cached,
            "local_engine.prefix_cache.hit_tokens": seq.num_cached,
            "local_engine.cancelled": cancelled,
            "local_engine.preemptions": seq.preemptions})
        if not server.is_recording():  # not sampled: nothing to build
            return
        if done and seq.finish_reason:
            server.set_attribute("gen_ai.response.finish_reasons", [seq.finish_reason])
        end_ns, ns = self._ns(end), self._ns
        context = self._in(server)
        admitted, first = seq.admitted_at, seq.first_token_at
        self._child("queue", context, ns(seq.arrived),
                    end_ns if admitted is None else ns(admitted), {})
        if admitted is not None:
            self._child("prefill", context, ns(admitted),
                        end_ns if first is None else ns(first),
                        {"local_engine.prefill.chunks": seq.prefill_chunks,
                         "local_engine.prefill.tokens": seq.prefill_tokens,
                         "local_engine.prefix_cache.hit_tokens": seq.num_cached})
        if first is not None:
            decode: dict[str, Any] = {"local_engine.decode.steps": seq.decode_steps}
            if seq.draft_tokens:
                decode["local_engine.speculative.draft_tokens"] = seq.draft_tokens
                decode["local_engine.speculative.accepted_tokens"] = seq.accepted_tokens
            self._child("decode", context, ns(first), end_ns, decode)
        self._end(server, end_ns, cancelled, error, seq.finish_reason)

    def _child(self, name: str, context: Context, start: int, end: int,
               attributes: dict[str, Any]) -> None:
        span = self._tracer.start_span(name, context, self._internal, attributes,
                                       start_time=start)
        span.end(max(start, end))

    def request_span(self, info: TraceInfo, cancelled: bool = False,
                     error: BaseException | None = None) -> None:
        """The span of a request that made no sequence (a scoring call, a prompt the
        engine refused), ended now."""
        server = self._server_span(info, {"gen_ai.usage.input_tokens": info.input_tokens,
                                          "local_engine.cancelled": cancelled})
        if server.is_recording():
            self._end(server, self._ns(time.perf_counter()), cancelled, error, None)

    def shutdown(self) -> None:
        """Export what is queued (bounded: the exporter's own timeout) and stop."""
        self.provider.force_flush(5000)
        self.provider.shutdown()


def make_tracer(enabled: bool, response_model: str = "") -> EngineTracer | None:
    """The engine's tracer (None when ``enabled`` is false: nothing is imported), with
    ``response_model`` as every span's ``gen_ai.response.model``."""
    if not enabled:
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    name = os.environ.get("OTEL_SERVICE_NAME") or "local-engine"
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return EngineTracer(provider, response_model)
