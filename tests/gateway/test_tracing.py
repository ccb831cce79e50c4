"""Issue 49: OpenTelemetry traces, as a collector receives them (a real OTLP/HTTP receiver,
protobuf decoded: gateway.testing.otlp_receiver), for each kind of request the issue names;
the upstream sees the gateway's trace context; the log line names the trace; an unreachable
collector costs spans, never requests; tracing off imports nothing of OpenTelemetry."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from gateway.app import create_app
from gateway.config import load_config
from gateway.testing.fake_upstream import FakeUpstream
from gateway.testing.otlp_receiver import OtlpReceiver, ReceivedSpan
from gateway.testing.server import ServerThread
from tests.conftest import DEFAULT_POLICY, FakeServer, GatewayServer
from tests.gateway.cache.test_cache_gateway import CACHE_POLICY, bag_of_words, stored
from tests.gateway.test_local_upstream import write_config

HI = [{"role": "user", "content": "hi"}]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as r:
        yield r


def tracing(receiver: OtlpReceiver, extra: str = "") -> str:
    return f"""
[tracing]
enabled = true
endpoint = "{receiver.endpoint}"
export_interval_ms = 20
{extra}
"""


class Trace:
    """One request's spans, by name and kind."""

    def __init__(self, spans: list[ReceivedSpan]) -> None:
        self.spans = spans
        [self.server] = [s for s in spans if s.kind == "server" and s.service == "llm-gateway"]

    @property
    def attempts(self) -> list[ReceivedSpan]:
        return sorted((s for s in self.spans if s.kind == "client"),
                      key=lambda s: s.attributes["llm_gateway.attempt"])

    def named(self, name: str) -> ReceivedSpan:
        [span] = [s for s in self.spans if s.name == name]
        return span

    def children(self, span: ReceivedSpan) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.parent_span_id == span.span_id]


def trace(receiver: OtlpReceiver, log: dict[str, object], n: int) -> Trace:
    """The trace of the request ``log`` names, once ``n`` of its spans arrived."""
    trace_id = log["trace_id"]
    assert isinstance(trace_id, str)
    return Trace(receiver.wait_for(
        lambda spans: sum(s.trace_id == trace_id for s in spans) >= n and any(
            s.trace_id == trace_id and s.kind == "server" for s in spans)
    ) and receiver.trace(trace_id))


def test_a_plain_request_is_one_server_span_over_one_client_span(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream,
        receiver: OtlpReceiver) -> None:
    gw = make_gateway(tracing(receiver))
    with openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0) as client:
        answer = client.chat.completions.create(model="fake-model", messages=HI, max_tokens=5,
                                                temperature=0.5, top_p=0.9)
    [log] = gw.logged(1)
    t = trace(receiver, log, 2)
    server = t.server
    assert server.name == "chat fake-model"
    assert server.span_id == log["span_id"] and server.parent_span_id == ""
    a = server.attributes
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.provider.name"] == "openai"
    assert (a["gen_ai.request.model"], a["gen_ai.response.model"]) == (
        "fake-model", "fake-upstream-model")
    assert (a["gen_ai.request.max_tokens"], a["gen_ai.request.temperature"],
            a["gen_ai.request.top_p"]) == (5, 0.5, 0.9)
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (
        answer.usage.prompt_tokens, answer.usage.completion_tokens)  # type: ignore[union-attr]
    assert a["gen_ai.response.finish_reasons"] == ["stop"]
    assert a["gen_ai.response.id"] == answer.id
    assert a["http.response.status_code"] == 200 and "error.type" not in a
    assert a["llm_gateway.request_id"] == log["request_id"]
    assert a["llm_gateway.policy_version"] == "test-1"
    assert a["llm_gateway.overhead_ms"] == log["overhead_ms"]
    [attempt] = t.attempts
    assert attempt.parent_span_id == server.span_id
    assert attempt.name == "chat fake-upstream-model"
    # the stages that ran let it pass unchanged (coalesce: alone; admission: a slot free)
    assert [s.name for s in t.spans if s.kind == "internal"] == []
    b = attempt.attributes
    assert (b["llm_gateway.upstream"], b["llm_gateway.attempt.reason"],
            b["llm_gateway.attempt.outcome"], b["http.response.status_code"]) == (
        "fake", "first", "ok", 200)
    assert b["server.address"] == "127.0.0.1" and isinstance(b["server.port"], int)
    # the upstream was sent the attempt's context, not the client's (it sent none)
    assert fake.records[0].headers["traceparent"] == \
        f"00-{server.trace_id}-{attempt.span_id}-03"
    # nothing of the conversation, nothing of a key
    everything = repr([s.attributes for s in t.spans]) + repr([s.events for s in t.spans])
    assert "hi" not in everything.replace("hit", "") and "Bearer" not in everything


def test_a_client_traceparent_is_continued_and_passed_on(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream,
        receiver: OtlpReceiver) -> None:
    gw = make_gateway(tracing(receiver))
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    r = httpx.post(gw.v1 + "/chat/completions", json={"model": "fake-model", "messages": HI},
                   headers={"traceparent": f"00-{trace_id}-{parent}-01",
                            "tracestate": "vendor=opaque"})
    assert r.status_code == 200
    [log] = gw.logged(1)
    assert log["trace_id"] == trace_id
    t = trace(receiver, log, 2)
    assert t.server.parent_span_id == parent
    [attempt] = t.attempts
    sent = fake.records[0].headers
    assert sent["traceparent"].startswith(f"00-{trace_id}-{attempt.span_id}-")
    assert sent["tracestate"] == "vendor=opaque"


def test_an_unsampled_traceparent_is_passed_on_as_it_came(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream,
        receiver: OtlpReceiver) -> None:
    gw = make_gateway(tracing(receiver))
    header = "00-5bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
    r = httpx.post(gw.v1 + "/chat/completions", json={"model": "fake-model", "messages": HI},
                   headers={"traceparent": header})
    assert r.status_code == 200
    [log] = gw.logged(1)
    assert "trace_id" not in log
    assert fake.records[0].headers["traceparent"] == header


def test_an_exact_cache_hit_has_a_cache_span_and_no_upstream_attempt(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream,
        receiver: OtlpReceiver) -> None:
    gw = make_gateway('[cache]\nenabled = true\nbackend = "memory"\n' + tracing(receiver),
                      policy=CACHE_POLICY, embed=bag_of_words)
    question = [{"role": "user", "content": "What is the capital of France?"}]
    with openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0) as client:
        client.chat.completions.create(model="fake-model", messages=question)
        stored(gw)
        client.chat.completions.create(model="fake-model", messages=question)
    log = gw.logged(2)[1]
    t = trace(receiver, log, 2)
    assert t.attempts == []
    a = t.server.attributes
    assert (a["llm_gateway.cache"], a["llm_gateway.cache_layer"]) == ("hit", "exact")
    assert a["gen_ai.provider.name"] == "llm_gateway"  # no upstream answered
    cache = t.named("cache")
    assert (cache.parent_span_id, cache.kind) == (t.server.span_id, "internal")
    assert cache.attributes["llm_gateway.cache"] == "hit"
    assert t.server.start_ns <= cache.start_ns <= cache.end_ns <= t.server.end_ns


FALLBACK = """
[models."retried-then-backup"]
targets = [{ upstream = "fake", model = "a" }, { upstream = "backup", model = "backup-model" }]
"""


def test_a_retry_then_a_fallback_target_are_attempts_in_order(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream,
        receiver: OtlpReceiver) -> None:
    gw = make_gateway(FALLBACK + tracing(receiver), policy=DEFAULT_POLICY.replace(
        "max_attempts = 3", "max_attempts = 2"))
    r = httpx.post(gw.v1 + "/chat/completions", headers={"x-fake-status": "503"}, json={
        "model": "retried-then-backup", "messages": HI, "stream": True})
    assert r.status_code == 503  # (the fake fails every path: the last answer passed on)
    [log] = gw.logged(1)
    t = trace(receiver, log, 5)
    assert [(s.attributes["llm_gateway.upstream"], s.attributes["llm_gateway.attempt.reason"],
             s.attributes["llm_gateway.attempt.outcome"], s.attributes["error.type"])
            for s in t.attempts] == [("fake", "first", "status", "503"),
                                     ("fake", "retry", "status", "503"),
                                     ("backup", "fallback", "status", "503"),
                                     ("backup", "retry", "status", "503")]
    assert all(s.status == "error" and s.parent_span_id == t.server.span_id
               for s in t.attempts)
    assert t.server.attributes["llm_gateway.retries"] == 3
    assert t.server.attributes["error.type"] == log["error_type"] == "server_error"
    assert t.server.status == "error"


def test_a_fallback_after_an_unreachable_target_answers(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream,
        receiver: OtlpReceiver) -> None:
    gw = make_gateway(tracing(receiver), policy=DEFAULT_POLICY.replace(
        "max_attempts = 3", "max_attempts = 1"))
    r = httpx.post(gw.v1 + "/chat/completions", json={"model": "with-fallback", "messages": HI})
    assert r.status_code == 200
    [log] = gw.logged(1)
    t = trace(receiver, log, 3)
    assert [(s.attributes["llm_gateway.upstream"], s.attributes["llm_gateway.attempt.outcome"],
             s.attributes.get("error.type")) for s in t.attempts] == [
        ("dead", "error", "UpstreamUnreachable"), ("backup", "ok", None)]
    assert t.attempts[1].attributes["llm_gateway.attempt.reason"] == "fallback"
    assert t.server.attributes["gen_ai.response.model"] == "backup-model"


SLOW_THEN_FAST = """
[upstreams.slow]
type = "openai"
base_url = "{url}/r1/v1"
headers = {{ "x-fake-ttft-ms" = "5000" }}

[upstreams.fast]
type = "openai"
base_url = "{url}/r2/v1"

[models.hedged]
targets = [{{ upstream = "slow", model = "m" }}, {{ upstream = "fast", model = "m" }}]
"""
HEDGE = DEFAULT_POLICY + '\n[balance]\nhedge_after_ms = { "hedged" = 30 }\nhedge_budget = 1.0\n'


def test_a_hedged_request_has_the_hedge_as_its_own_attempt(
        make_gateway: Callable[..., GatewayServer], fake_server: FakeServer,
        fake: FakeUpstream, receiver: OtlpReceiver) -> None:
    gw = make_gateway(SLOW_THEN_FAST.format(url=fake_server.url) + tracing(receiver),
                      policy=HEDGE)
    with openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0) as client:
        client.chat.completions.create(model="hedged", messages=HI)
    [log] = gw.logged(1)
    t = trace(receiver, log, 3)
    slow, fast = t.attempts
    assert (slow.attributes["llm_gateway.upstream"], slow.attributes["llm_gateway.attempt.reason"],
            slow.attributes["llm_gateway.attempt.outcome"]) == ("slow", "first", "cancelled")
    assert (fast.attributes["llm_gateway.upstream"], fast.attributes["llm_gateway.attempt.reason"],
            fast.attributes["llm_gateway.attempt.outcome"]) == ("fast", "hedge", "ok")
    assert fast.start_ns - slow.start_ns >= 30_000_000  # sent after the hedge delay
    assert t.server.attributes["llm_gateway.hedged"] is True
    assert t.server.attributes["llm_gateway.upstream"] == "fast"
    # each upstream call carried its own attempt's context
    sent = {r.path.split("/")[1]: r.headers["traceparent"] for r in fake.records}
    assert sent["r1"].split("-")[2] == slow.span_id and sent["r2"].split("-")[2] == fast.span_id


def test_a_stream_the_client_leaves_ends_its_spans_marked_cancelled(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream,
        receiver: OtlpReceiver) -> None:
    gw = make_gateway(tracing(receiver))
    with httpx.Client() as client, client.stream(
            "POST", gw.v1 + "/chat/completions",
            headers={"x-fake-itl-ms": "200", "x-fake-tokens": "50"},
            json={"model": "fake-model", "messages": HI, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and '"content"' in line:
                break  # the first token: gone
    [log] = gw.logged(1)
    assert log["cancelled"] is True
    t = trace(receiver, log, 2)
    a = t.server.attributes
    assert a["llm_gateway.cancelled"] is True and a["gen_ai.request.stream"] is True
    assert t.server.event("cancel") is not None
    assert t.server.event("first_token") is not None
    assert a["gen_ai.response.time_to_first_chunk"] == pytest.approx(log["ttft_ms"] / 1000)
    [attempt] = t.attempts
    assert attempt.attributes["llm_gateway.attempt.outcome"] == "ok"  # the upstream's part
    assert attempt.end_ns <= t.server.end_ns
    assert t.server.end_ns - t.server.start_ns < 5_000_000_000  # not the 10 s stream


def test_an_anthropic_client_translated_to_an_openai_upstream(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream,
        receiver: OtlpReceiver) -> None:
    gw = make_gateway(tracing(receiver))
    with anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0) as client, \
            client.messages.stream(model="fake-model", max_tokens=50, messages=[
                {"role": "user", "content": "hi"}]) as stream:
        message = stream.get_final_message()
    [log] = gw.logged(1)
    t = trace(receiver, log, 2)
    a = t.server.attributes
    assert t.server.name == "chat fake-model"
    assert (a["http.route"], a["llm_gateway.api"], a["gen_ai.provider.name"]) == (
        "/v1/messages", "anthropic", "openai")
    assert a["gen_ai.request.max_tokens"] == 50
    assert a["gen_ai.usage.output_tokens"] == message.usage.output_tokens
    [attempt] = t.attempts
    assert attempt.attributes["gen_ai.provider.name"] == "openai"
    assert fake.records[0].path == "/v1/chat/completions"
    assert fake.records[0].headers["traceparent"].split("-")[2] == attempt.span_id


def test_content_is_recorded_only_when_asked(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream,
        receiver: OtlpReceiver) -> None:
    gw = make_gateway(tracing(receiver, "capture_content = true"))
    httpx.post(gw.v1 + "/chat/completions", json={"model": "fake-model", "messages": HI})
    [log] = gw.logged(1)
    a = trace(receiver, log, 2).server.attributes
    assert '"content":"hi"' in a["gen_ai.input.messages"]
    assert "w0 w1" in a["gen_ai.output.messages"]


def test_an_unreachable_collector_drops_spans_never_requests(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream) -> None:
    gw = make_gateway("""
[tracing]
enabled = true
endpoint = "http://127.0.0.1:9/v1/traces"
export_interval_ms = 10
export_timeout_ms = 200
max_queue_size = 4
""")
    with openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0) as client:
        for _ in range(6):
            client.chat.completions.create(model="fake-model", messages=HI)
    assert [log["status"] for log in gw.logged(6)] == [200] * 6
    assert gw.gateway.tracing is not None
    gw.gateway.tracing.force_flush(2000)

    def dropped() -> dict[str, float]:
        text = httpx.get(gw.url + "/metrics").text
        return {outcome: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                for outcome in ("export_failed", "queue_full", "exported")
                if line.startswith(f'gateway_trace_spans_total{{outcome="{outcome}"}}')}
    counts = dropped()
    assert counts["exported"] == 0
    assert counts["export_failed"] + counts["queue_full"] >= 6  # a span per request at least


def test_tracing_off_imports_nothing_of_opentelemetry_tracing() -> None:
    # (redis-py 8 imports the SDK's metrics on its own whenever the SDK is installed)
    code = ("import sys\n"
            "from gateway.app import create_app\n"
            "from gateway.config import load_config\n"
            "create_app(load_config('gateway.example.toml'), watch_policy=False)\n"
            "print(sorted(m for m in sys.modules if m.startswith(("
            "'opentelemetry.sdk.trace', 'opentelemetry.exporter'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120, cwd=ROOT)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_local_engine_s_spans_sit_under_the_gateway_s_attempt(
        tmp_path: Path, tiny_model_dir: Path, receiver: OtlpReceiver) -> None:
    config = write_config(tmp_path, tiny_model_dir)
    config.write_text(config.read_text() + tracing(receiver))
    app = create_app(load_config(config))
    with ServerThread(app) as srv, openai.OpenAI(base_url=srv.url + "/v1", api_key="k",
                                                  max_retries=0) as client:
        stream = client.chat.completions.create(model="tiny", messages=HI, max_tokens=4,
                                                temperature=0, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        gateway_span = receiver.wait_for(lambda spans: any(
            s.service == "llm-gateway" and s.kind == "server" and s.name == "chat tiny"
            for s in spans))
        [server] = [s for s in gateway_span if s.service == "llm-gateway"
                    and s.kind == "server" and s.name == "chat tiny"]
        engine_spans = receiver.wait_for(lambda spans: sum(
            s.trace_id == server.trace_id and s.service == "llm-gateway-engine"
            for s in spans) >= 4)
    t = Trace([s for s in engine_spans if s.trace_id == server.trace_id])
    [attempt] = t.attempts
    assert attempt.attributes["gen_ai.provider.name"] == "local_engine"
    [engine] = [s for s in t.spans if s.service == "llm-gateway-engine" and s.kind == "server"]
    assert engine.parent_span_id == attempt.span_id  # under the gateway's attempt
    assert engine.attributes["gen_ai.usage.output_tokens"] == \
        server.attributes["gen_ai.usage.output_tokens"]
    phases = {s.name: s for s in t.children(engine)}
    assert {"queue", "prefill", "decode"} <= set(phases)
    assert phases["prefill"].attributes["local_engine.prefill.chunks"] >= 1
    assert phases["decode"].attributes["local_engine.decode.steps"] >= 1
    assert attempt.start_ns <= engine.start_ns and engine.end_ns <= server.end_ns


def test_a_replica_pool_s_choice_is_on_the_attempt(
        make_gateway: Callable[..., GatewayServer], fake_server: FakeServer,
        fake: FakeUpstream, receiver: OtlpReceiver) -> None:
    gw = make_gateway(f"""
[upstreams.pool]
type = "openai"
replicas = ["http://127.0.0.1:9/v1", "{fake_server.url}/v1"]
connect_timeout_ms = 500

[upstreams.pool.pool]
routing = "round_robin"

[models.pooled]
targets = [{{ upstream = "pool", model = "m" }}]
""" + tracing(receiver))
    for _ in range(2):  # one starts on the dead replica, one on the live one
        r = httpx.post(gw.v1 + "/chat/completions", json={"model": "pooled", "messages": HI})
        assert r.status_code == 200
    reasons = set()
    for log in gw.logged(2):
        [attempt] = trace(receiver, log, 2).attempts
        assert attempt.attributes["llm_gateway.replica"] == fake_server.url + "/v1"
        reasons.add(attempt.attributes["llm_gateway.replica.reason"])
    assert reasons == {"round_robin", "next_after_unreachable"}
    sent = [r.headers["traceparent"].split("-")[2] for r in fake.records
            if r.path.endswith("/chat/completions")]
    assert attempt.span_id in sent
