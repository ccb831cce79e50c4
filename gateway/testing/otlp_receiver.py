"""A real OTLP/HTTP trace receiver for tests: ``POST /v1/traces`` with a protobuf
``ExportTraceServiceRequest`` (as the OpenTelemetry collector takes it), decoded with the
project's own ``opentelemetry-proto`` classes into plain :class:`ReceivedSpan` records.

    with OtlpReceiver() as receiver:          # listening on 127.0.0.1, a free port
        ... receiver.endpoint ...             # "http://127.0.0.1:PORT/v1/traces"
        spans = receiver.wait_for(lambda spans: any(s.name == "chat m" for s in spans))

It answers 200 with an empty ``ExportTraceServiceResponse``; ``fail_with`` set to a status
makes it refuse every export (a collector that is down or overloaded).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

__all__ = ["OtlpReceiver", "ReceivedSpan"]

_KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer",
          5: "consumer"}
_STATUS = {0: "unset", 1: "ok", 2: "error"}


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return None if kind is None else getattr(v, kind)


@dataclass
class ReceivedSpan:
    """One exported span: ids in lowercase hex ("" for no parent), times in ns since the
    epoch, ``service`` its resource's ``service.name``."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    status: str
    status_message: str
    service: str
    resource: dict[str, Any] = field(default_factory=dict)
    scope: str = ""

    def event(self, name: str) -> dict[str, Any] | None:
        for event_name, attributes in self.events:
            if event_name == name:
                return attributes
        return None


class OtlpReceiver:
    """Collects every span exported to it (thread-safe; a context manager)."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.exports = 0  # requests received
        self.fail_with: int | None = None
        self._changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                if self.path != "/v1/traces" or self.headers.get(
                        "content-type") != "application/x-protobuf":
                    self.send_response(404 if self.path != "/v1/traces" else 415)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                failing = receiver.fail_with
                if failing is None:
                    receiver._receive(body, dict(self.headers))
                out = b"" if failing else ExportTraceServiceResponse().SerializeToString()
                self.send_response(failing or 200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: Any) -> None:
                pass

        self.headers_seen: list[dict[str, str]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _receive(self, body: bytes, headers: dict[str, str]) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        spans = []
        for rs in request.resource_spans:
            resource = {kv.key: _value(kv.value) for kv in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    spans.append(ReceivedSpan(
                        name=s.name, trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                        parent_span_id=s.parent_span_id.hex(), kind=_KINDS[s.kind],
                        start_ns=s.start_time_unix_nano, end_ns=s.end_time_unix_nano,
                        attributes={kv.key: _value(kv.value) for kv in s.attributes},
                        events=[(e.name, {kv.key: _value(kv.value) for kv in e.attributes})
                                for e in s.events],
                        status=_STATUS[s.status.code], status_message=s.status.message,
                        service=str(resource.get("service.name", "")), resource=resource,
                        scope=ss.scope.name))
        with self._changed:
            self.exports += 1
            self.headers_seen.append({k.lower(): v for k, v in headers.items()})
            self.spans.extend(spans)
            self._changed.notify_all()

    def wait_for(self, done: Callable[[list[ReceivedSpan]], bool],
                 timeout_s: float = 15.0) -> list[ReceivedSpan]:
        """The spans received so far, once ``done(spans)`` holds (blocks; AssertionError
        after ``timeout_s`` with what did arrive)."""
        with self._changed:
            if not self._changed.wait_for(lambda: done(self.spans), timeout_s):
                names = [(s.service, s.name) for s in self.spans]
                raise AssertionError(f"spans not received in {timeout_s} s; got {names}")
            return list(self.spans)

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self._changed:
            return [s for s in self.spans if s.trace_id == trace_id]
