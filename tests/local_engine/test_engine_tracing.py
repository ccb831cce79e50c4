"""The engine's OpenTelemetry spans (``--tracing``), exported over OTLP/HTTP to a real
receiver: a request's W3C ``traceparent`` is continued, and its queue, prefill and decode
come back as children of the engine's server span.

The model is the tiny random Llama with a character tokenizer; the OTLP exporter and the
batch processor read their settings from the environment, as the engine's do when the
gateway spawns it.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from gateway.testing.otlp_receiver import OtlpReceiver, ReceivedSpan
from gateway.testing.server import ServerThread
from local_engine.async_engine import AsyncEngine
from local_engine.engine import Engine
from local_engine.server import EngineServer, build_app
from local_engine.speculative import SpecConfig
from local_engine.tracing import make_tracer
from tests.local_engine.test_server import FailingEngine

PARENT_ID = "00f067aa0ba902b7"


class CharTokenizer:
    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool,
                            tokenize: bool, continue_final_message: bool = False) -> list[int]:
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"
        return [2 + ord(c) % 94 for c in text]

    def __call__(self, text: str, add_special_tokens: bool,
                 return_offsets_mapping: bool) -> dict[str, list]:
        return {"input_ids": [2 + ord(c) % 94 for c in text],
                "offset_mapping": [(i, i + 1) for i in range(len(text))]}


@dataclass
class Traced:
    url: str
    engine: Engine
    receiver: OtlpReceiver
    client: openai.OpenAI
    trace_id: str  # this test's own: the receiver serves the whole module

    def chat(self, trace_id: str = "", flags: str = "01", **kwargs: object) -> object:
        headers = {"traceparent": f"00-{trace_id or self.trace_id}-{PARENT_ID}-{flags}",
                   "tracestate": "vendor=1"}
        args = {"model": "tiny", "messages": [{"role": "user", "content": "hello there, "
                                               "a prompt of a few KV blocks"}],
                "max_tokens": 6, "temperature": 0, **kwargs}
        return self.client.chat.completions.create(extra_headers=headers, **args)

    def spans(self, server_spans: int = 1) -> list[ReceivedSpan]:
        """The test's trace's spans once ``server_spans`` server spans (and their
        children) arrived."""
        def done(spans: list[ReceivedSpan]) -> bool:
            mine = [s for s in spans if s.trace_id == self.trace_id]
            servers = {s.span_id for s in mine if s.kind == "server"}
            children = {s.parent_span_id for s in mine if s.name == "queue"}
            return len(servers) >= server_spans and servers <= children
        self.receiver.wait_for(done, timeout_s=10)
        return self.receiver.trace(self.trace_id)


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver


@contextlib.contextmanager
def serving(engine: Engine, receiver: OtlpReceiver,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[Traced]:
    """``engine`` served with tracing on, exporting to ``receiver``."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # ms: export quickly
    for name in ("OTEL_SERVICE_NAME", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG"):
        monkeypatch.delenv(name, raising=False)
    aengine = AsyncEngine(engine, tracer=make_tracer(True, "tiny-model")).start()
    server = EngineServer(aengine, "tiny-model", CharTokenizer(), None, default_max_tokens=16)
    with ServerThread(build_app(server)) as srv, openai.OpenAI(
            base_url=srv.url + "/v1", api_key="unused", max_retries=0) as client:
        yield Traced(srv.url, engine, receiver, client, uuid.uuid4().hex)


@pytest.fixture
def traced(make_engine: Callable[..., Engine], receiver: OtlpReceiver,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[Traced]:
    # every draft verified (goodput off), looked up by one token: drafts on the random model
    spec = SpecConfig(min_n=1, max_n=1, num_tokens=2, goodput=False, min_acceptance=0.0)
    with serving(make_engine(max_model_len=400, speculative=spec), receiver,
                 monkeypatch) as traced:
        yield traced


def _by_name(spans: list[ReceivedSpan]) -> dict[str, ReceivedSpan]:
    return {s.name: s for s in spans}


def test_a_request_with_a_traceparent_gets_the_engines_spans_under_it(traced: Traced) -> None:
    traced.chat()
    spans = _by_name(traced.spans())
    assert set(spans) == {"chat tiny", "queue", "prefill", "decode"}
    server = spans["chat tiny"]
    assert (server.kind, server.parent_span_id, server.service) == ("server", PARENT_ID,
                                                                    "local-engine")
    a = server.attributes
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "tiny"
    assert a["gen_ai.response.model"] == "tiny-model"
    assert a["gen_ai.response.id"].startswith("chatcmpl-")
    assert a["gen_ai.usage.input_tokens"] > 30 and a["gen_ai.usage.output_tokens"] == 6
    assert a["gen_ai.response.finish_reasons"] == ["length"]
    assert (a["gen_ai.request.max_tokens"], a["gen_ai.request.temperature"],
            a["gen_ai.request.top_p"]) == (6, 0.0, 1.0)
    assert a["local_engine.cancelled"] is False and a["local_engine.preemptions"] == 0
    assert a["local_engine.prefix_cache.hit_tokens"] == 0
    assert server.event("finish") == {"local_engine.finish_reason": "length"}
    assert server.event("cancel") is None and server.status == "unset"
    queue, prefill, decode = spans["queue"], spans["prefill"], spans["decode"]
    for child in (queue, prefill, decode):
        assert (child.kind, child.parent_span_id) == ("internal", server.span_id)
    # the phases follow each other inside the server span
    assert server.start_ns <= queue.start_ns <= queue.end_ns <= prefill.start_ns
    assert prefill.end_ns == decode.start_ns <= decode.end_ns == server.end_ns
    p = prefill.attributes
    assert p["local_engine.prefill.chunks"] >= 1
    assert p["local_engine.prefill.tokens"] == a["gen_ai.usage.input_tokens"]
    d = decode.attributes
    # 5 tokens after the first, some of them gained by accepted drafts
    steps = d["local_engine.decode.steps"]
    assert 1 <= steps <= 5 and d["local_engine.speculative.draft_tokens"] >= 1
    assert steps + d["local_engine.speculative.accepted_tokens"] >= 5


def test_a_repeated_prompt_shows_its_prefix_cache_hit(traced: Traced) -> None:
    traced.chat()
    traced.chat()
    spans = traced.spans(server_spans=2)
    servers = sorted((s for s in spans if s.kind == "server"), key=lambda s: s.start_ns)
    first, second = (s.attributes for s in servers)
    assert first["local_engine.prefix_cache.hit_tokens"] == 0
    hit = second["local_engine.prefix_cache.hit_tokens"]
    assert hit > 0 and second["gen_ai.usage.cache_read.input_tokens"] == hit
    prefill = next(s for s in spans if s.name == "prefill"
                   and s.parent_span_id == servers[1].span_id)
    assert prefill.attributes["local_engine.prefix_cache.hit_tokens"] == hit
    assert prefill.attributes["local_engine.prefill.tokens"] == (
        second["gen_ai.usage.input_tokens"] - hit)


def test_a_stream_the_client_abandons_gives_a_cancelled_span(traced: Traced) -> None:
    stream = traced.chat(max_tokens=300, stream=True)
    next(iter(stream))  # type: ignore[call-overload]
    stream.close()  # type: ignore[attr-defined]
    server = _by_name(traced.spans())["chat tiny"]
    assert server.attributes["local_engine.cancelled"] is True
    assert server.event("cancel") is not None and server.event("finish") is None
    assert "gen_ai.response.finish_reasons" not in server.attributes
    assert server.attributes["gen_ai.usage.output_tokens"] < 300


def test_an_unsampled_traceparent_exports_nothing(traced: Traced) -> None:
    unsampled = "0af7651916cd43dd8448eb211c80319c"
    traced.chat(trace_id=unsampled, flags="00")
    traced.chat()  # exported after the first would have been
    traced.spans()
    assert traced.receiver.trace(unsampled) == []


def test_scoring_and_a_refused_prompt_get_server_spans(traced: Traced) -> None:
    headers = {"traceparent": f"00-{traced.trace_id}-{PARENT_ID}-01"}
    r = httpx.post(traced.url + "/v1/completions", headers=headers,
                   json={"model": "tiny", "prompt": "score me", "echo": True,
                         "max_tokens": 0, "logprobs": 0})
    assert r.status_code == 200
    with pytest.raises(openai.BadRequestError):
        traced.chat(messages=[{"role": "user", "content": "x" * 500}])

    def both(spans: list[ReceivedSpan]) -> bool:
        return {"text_completion tiny", "chat tiny"} <= {
            s.name for s in spans if s.trace_id == traced.trace_id}
    traced.receiver.wait_for(both, timeout_s=10)
    spans = _by_name(traced.receiver.trace(traced.trace_id))
    scoring = spans["text_completion tiny"]
    assert scoring.parent_span_id == PARENT_ID and scoring.kind == "server"
    assert scoring.attributes["gen_ai.usage.input_tokens"] == len("score me")
    assert scoring.event("finish") == {} and scoring.status == "unset"
    refused = spans["chat tiny"]
    assert refused.status == "error"
    assert refused.attributes["error.type"] == "PromptTooLong"


def test_an_engine_failure_marks_the_span_as_an_error(
        make_engine: Callable[..., Engine], receiver: OtlpReceiver,
        monkeypatch: pytest.MonkeyPatch) -> None:
    made = make_engine()
    engine = FailingEngine(made.model, made.decode, made.config, tuple(made.eos))
    with serving(engine, receiver, monkeypatch) as traced:
        stream = traced.chat(max_tokens=50, stream=True)
        with pytest.raises(openai.APIError):
            for _ in stream:  # type: ignore[attr-defined]
                pass
        spans = _by_name(traced.spans())
    server = spans["chat tiny"]
    assert server.status == "error" and server.attributes["error.type"] == "RuntimeError"
    assert server.event("finish") is None and server.event("cancel") is None
    assert set(spans) == {"chat tiny", "queue", "prefill", "decode"}


def test_with_tracing_off_the_engine_imports_no_opentelemetry() -> None:
    """The engine's server built and serving a request without ``--tracing``."""
    code = """
import argparse, sys
from starlette.testclient import TestClient
from local_engine.async_engine import AsyncEngine
from local_engine.server import EngineServer, add_arguments, build_app
from local_engine.tracing import make_tracer
parser = argparse.ArgumentParser()
add_arguments(parser)
args = parser.parse_args([])
class Tokenizer:
    def apply_chat_template(self, *args, **kwargs):
        return [2, 3, 4]
engine = AsyncEngine(None, tracer=make_tracer(args.tracing)).start()
server = EngineServer(engine, "m", Tokenizer(), None)
with TestClient(build_app(server), raise_server_exceptions=False) as client:
    r = client.post("/v1/chat/completions", headers={"traceparent": sys.argv[1]},
                    json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
print(r.status_code, sorted(m for m in sys.modules if m.startswith("opentelemetry")))
"""
    traceparent = f"00-{uuid.uuid4().hex}-{PARENT_ID}-01"
    out = subprocess.run([sys.executable, "-c", code, traceparent], capture_output=True,
                         text=True, cwd=Path(__file__).parents[2], timeout=60,
                         check=True).stdout
    status, modules = out.split(" ", 1)
    assert int(status) == 500  # no model: the request ran into the engine, which refused
    assert modules.strip() == "[]"
