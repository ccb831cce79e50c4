"""``[tracing]``: OpenTelemetry traces (issue 49; :mod:`gateway.tracing`), off by default.

What the table leaves unset comes from the OpenTelemetry SDK's standard environment
variables (https://opentelemetry.io/docs/specs/otel/configuration/sdk-environment-variables/):
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT`` and their
``*_HEADERS`` (the exporter reads them itself), ``OTEL_SERVICE_NAME``,
``OTEL_TRACES_SAMPLER_ARG`` (the ratio); ``OTEL_SDK_DISABLED=true`` turns tracing off
whatever the table says.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from gateway.schema import bounded

__all__ = ["TracingConfig"]


@dataclass(frozen=True)
class TracingConfig:
    enabled: bool = False
    #: The collector's OTLP/HTTP traces URL, e.g. ``http://otel-collector:4318/v1/traces``.
    #: Unset: the environment's, else the SDK's default (``http://localhost:4318/v1/traces``).
    endpoint: str | None = None
    #: Headers sent with each export (non-secret ones; a collector's API key belongs in
    #: ``OTEL_EXPORTER_OTLP_TRACES_HEADERS``, which is read only when this is empty).
    headers: dict[str, str] = field(default_factory=dict)
    #: ``service.name`` of the spans. Unset: ``OTEL_SERVICE_NAME``, else "llm-gateway". The
    #: local engines it starts report as this name + "-engine".
    service_name: str | None = None
    #: The share of traces started here that are recorded (parent-based: a request arriving
    #: with a ``traceparent`` follows its sampled flag). Unset: ``OTEL_TRACES_SAMPLER_ARG``,
    #: else 1.0.
    sample_ratio: float | None = bounded(None, ge=0.0, le=1.0)
    #: Record prompts and completions on the spans (``gen_ai.input.messages``,
    #: ``gen_ai.output.messages``; opt-in, as the conventions say). Keys never are.
    capture_content: bool = False
    #: Ended spans waiting for export (a bounded queue: past it spans are dropped and
    #: counted, never a request delayed; the SDK's default).
    max_queue_size: int = bounded(2048, ge=1)
    #: How often the batch processor exports (ms; the SDK's default).
    export_interval_ms: int = bounded(5000, ge=1)
    #: One export's time limit (ms; the SDK's default).
    export_timeout_ms: int = bounded(10_000, ge=1)

    @property
    def on(self) -> bool:
        """Enabled, and not switched off by ``OTEL_SDK_DISABLED``."""
        return self.enabled and os.environ.get("OTEL_SDK_DISABLED", "").lower() != "true"

    @property
    def service(self) -> str:
        return self.service_name or os.environ.get("OTEL_SERVICE_NAME") or "llm-gateway"

    @property
    def ratio(self) -> float:
        if self.sample_ratio is not None:
            return self.sample_ratio
        try:
            return min(1.0, max(0.0, float(os.environ.get("OTEL_TRACES_SAMPLER_ARG", "1"))))
        except ValueError:
            return 1.0
