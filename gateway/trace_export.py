"""What becomes of the gateway's ended spans (exported, or dropped and why), counted around
the OpenTelemetry SDK's batch span processor and OTLP exporter for /metrics: the SDK drops
spans silently when its bounded queue is full or an export fails (gateway.tracing)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExportResult
    from prometheus_client.registry import Collector

__all__ = ["SpanCounts", "counting_parts"]


class SpanCounts:
    """Ended spans by fate, for /metrics: ``exported``, ``export_failed`` (the collector
    refused or could not be reached: dropped), ``queue_full`` (dropped before export)."""

    def __init__(self) -> None:
        self.ended = self.exported = self.export_failed = self.queue_full = 0
        self.exporting = 0  # spans of the export under way

    def collector(self) -> Collector:
        from prometheus_client.core import CounterMetricFamily
        from prometheus_client.registry import Collector

        counts = self

        class SpanCollector(Collector):
            def collect(self) -> Any:
                spans = CounterMetricFamily(
                    "gateway_trace_spans", "Ended trace spans by fate: exported, or dropped "
                    "(export_failed: the collector refused or was unreachable; queue_full: "
                    "more spans than tracing.max_queue_size waited)", labels=["outcome"])
                for outcome in ("exported", "export_failed", "queue_full"):
                    spans.add_metric([outcome], getattr(counts, outcome))
                yield spans

        return SpanCollector()


def counting_parts(counts: SpanCounts, max_queue: int) -> tuple[type, type]:
    """A span exporter and a span processor that count what becomes of each span around
    the SDK's own (the batch processor drops silently when its queue is full)."""
    from opentelemetry.sdk.trace import SpanProcessor
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class CountingExporter(SpanExporter):
        def __init__(self, inner: SpanExporter) -> None:
            self.inner = inner

        def export(self, spans: Any) -> SpanExportResult:
            n = counts.exporting = len(spans)
            result = SpanExportResult.FAILURE
            try:
                result = self.inner.export(spans)
            finally:  # (the exporter's own exception too: the batch processor logs it)
                if result is SpanExportResult.SUCCESS:
                    counts.exported += n
                else:
                    counts.export_failed += n
                counts.exporting = 0
            return result

        def shutdown(self) -> None:
            self.inner.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return self.inner.force_flush(timeout_millis)

    class CountingProcessor(SpanProcessor):
        def __init__(self, inner: SpanProcessor) -> None:
            self.inner = inner

        def on_start(self, span: Any, parent_context: Any = None) -> None:
            self.inner.on_start(span, parent_context)

        def on_end(self, span: ReadableSpan) -> None:
            c = counts
            waiting = (c.ended - c.exported - c.export_failed - c.queue_full - c.exporting)
            c.ended += 1
            if waiting >= max_queue:  # the batch processor drops one now
                c.queue_full += 1
            self.inner.on_end(span)

        def shutdown(self) -> None:
            self.inner.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return self.inner.force_flush(timeout_millis)

    return CountingExporter, CountingProcessor
