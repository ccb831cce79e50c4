"""What the OpenTelemetry SDK itself costs per traced request (issue 49), beside what the
gateway's tracing code adds: the floor under ``bench/overhead.py --instructions`` with
``--instructions-config bench/tracing.toml``.

In one process, no server: ``requests`` times (CPU seconds, ``time.process_time``) of

- ``sdk_spans``: the SDK alone making and ending the spans a plain request gets (a SERVER
  span with the attributes the gateway sets on it, a CLIENT span with an attempt's, the
  trace context injected), with no gateway code;
- ``gateway``: the same request traced through gateway.tracing (``Tracing.start``, an
  attempt's span, ``RequestTrace.end`` filling the span from a finished record);
- ``encode``: the OTLP exporter's protobuf encoding of those spans (the batch processor's
  thread does it, holding the GIL);
- ``unsampled``: a request the sampler leaves out (``sample_ratio = 0``).

Prints the JSON document and one line: ``tracing sdk: ...`` (us per request).

    python bench/tracing_sdk.py [--requests 3000]
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable
from typing import Any

import orjson

from gateway.requestlog import RequestRecord
from gateway.tracing import Tracing
from gateway.tracing_config import TracingConfig

SERVER = {"gen_ai.operation.name": "chat", "http.route": "/v1/chat/completions",
          "http.response.status_code": 200, "gen_ai.request.stream": False,
          "gen_ai.request.model": "m", "gen_ai.response.model": "m2",
          "gen_ai.usage.input_tokens": 10, "gen_ai.usage.output_tokens": 5,
          "gen_ai.response.finish_reasons": ["stop"], "gen_ai.response.id": "chatcmpl-1",
          "llm_gateway.request_id": "0" * 32, "llm_gateway.api": "openai",
          "llm_gateway.upstream": "fake", "llm_gateway.policy_version": "v",
          "llm_gateway.overhead_ms": 0.2, "llm_gateway.upstream_ms": 1.1,
          "gen_ai.provider.name": "openai"}
CLIENT = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
          "gen_ai.request.model": "m2", "server.address": "127.0.0.1", "server.port": 8000,
          "llm_gateway.upstream": "fake", "llm_gateway.attempt": 1,
          "llm_gateway.attempt.reason": "first"}


def tracing(ratio: float) -> Tracing:
    return Tracing(TracingConfig(enabled=True, endpoint="http://127.0.0.1:9/v1/traces",
                                 export_interval_ms=10**7, max_queue_size=10**6,
                                 sample_ratio=ratio))


def sdk_spans(t: Tracing) -> Callable[[], None]:
    def one() -> None:
        server = t.tracer.start_span("request", kind=t.server)
        client = t.tracer.start_span("chat m2", context=t.in_context(server), kind=t.client,
                                     attributes=CLIENT)
        t.propagator.inject({}, context=t.in_context(client))
        client.set_attributes({"http.response.status_code": 200,
                               "llm_gateway.attempt.outcome": "ok"})
        client.end()
        server.update_name("chat m")
        server.set_attributes(SERVER)
        server.end()
    return one


def through_gateway(t: Tracing) -> Callable[[], None]:
    def one() -> None:
        rec = RequestRecord("0" * 32, "/v1/chat/completions")
        trace = t.start({}, rec.started, "/v1/chat/completions")
        rec.model_requested, rec.model_served, rec.upstream, rec.status = "m", "m2", "fake", 200
        rec.prompt_tokens, rec.completion_tokens, rec.finish_reason = 10, 5, "stop"
        rec.policy_version = "v"
        if trace is not None:
            client = t.tracer.start_span("chat m2", context=t.in_context(trace.span),
                                         kind=t.client, attributes=CLIENT)
            t.propagator.inject({}, context=t.in_context(client))
            client.set_attributes({"http.response.status_code": 200,
                                   "llm_gateway.attempt.outcome": "ok"})
            client.end()
            rec.finish()
            trace.end(rec, None)
    return one


def per_request_us(one: Callable[[], None], n: int) -> float:
    for _ in range(min(n, 300)):
        one()
    start = time.process_time()
    for _ in range(n):
        one()
    return round((time.process_time() - start) / n * 1e6, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=3000)
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # the exporter's retries to a closed port
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    t = tracing(1.0)
    results: dict[str, Any] = {"sdk_spans": per_request_us(sdk_spans(t), args.requests),
                               "gateway": per_request_us(through_gateway(t), args.requests)}
    queued = list(t._processor.inner._batch_processor._queue)[:1024]  # type: ignore[attr-defined]
    start = time.process_time()
    encode_spans(queued).SerializeToString()
    results["encode"] = round((time.process_time() - start) / len(queued) * 2 * 1e6, 1)
    results["unsampled"] = per_request_us(through_gateway(tracing(0.0)), args.requests)
    results["gateway_over_sdk"] = round(results["gateway"] / results["sdk_spans"], 3)
    print(orjson.dumps({"bench": "tracing_sdk", "unit": "us of CPU per request (2 spans)",
                        "requests": args.requests, **results},
                       option=orjson.OPT_INDENT_2).decode())
    print(f"tracing sdk: the SDK's 2 spans {results['sdk_spans']} us, through gateway.tracing "
          f"{results['gateway']} us ({results['gateway_over_sdk']}x), their OTLP encoding "
          f"{results['encode']} us (export thread), unsampled {results['unsampled']} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
