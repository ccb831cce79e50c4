"""Early bytes (issue 31): a stream's head goes to the client as soon as its upstream
accepts, not with the first event a prefill or a queue away, and so does an Anthropic
client's ``message_start`` on a translated stream (once, in what the cache keeps and what
coalesced clients get too); what an upstream refuses keeps its HTTP status. The upstream
holds its first event until the test has seen the head."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import openai
import orjson
import pytest

from gateway.testing.server import ServerThread
from tests.conftest import DEFAULT_POLICY, GatewayServer

HELD = """
[upstreams.held]
type = "openai"
base_url = "{url}/v1"

[models.held]
targets = [{{ upstream = "held", model = "m" }}]
"""


class HeldFirstEvent:
    """An OpenAI-style chat upstream that answers 200 at once, then holds its first event
    until ``release`` is set (5 s at most), ``sent`` once it has sent it; with ``status``
    other than 200, answers that error instead."""

    def __init__(self) -> None:
        self.release, self.sent = threading.Event(), threading.Event()
        self.status = 200

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": message["type"] + ".complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        while (await receive()).get("more_body"):
            pass
        if self.status != 200:
            body = orjson.dumps({"error": {"message": "no", "type": "invalid_request_error",
                                           "param": None, "code": None}})
            await send({"type": "http.response.start", "status": self.status,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": body})
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        await asyncio.to_thread(self.release.wait, 5)
        events = [{"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0,
                   "model": "m", "choices": [{"index": 0, "delta": delta,
                                              "finish_reason": finish}]}
                  for delta, finish in (({"role": "assistant", "content": ""}, None),
                                        ({"content": "held"}, None), ({}, "stop"))]
        body = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events)
        self.sent.set()
        await send({"type": "http.response.body", "body": body + b"data: [DONE]\n\n"})


@pytest.fixture
def held(make_gateway: Callable[..., GatewayServer]) -> Iterator[tuple[HeldFirstEvent,
                                                                      GatewayServer]]:
    upstream = HeldFirstEvent()
    with ServerThread(upstream) as srv:
        yield upstream, make_gateway(HELD.format(url=srv.url))
        upstream.release.set()


def test_the_head_goes_out_when_the_upstream_accepts(
        held: tuple[HeldFirstEvent, GatewayServer]) -> None:
    upstream, gw = held
    with openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0) as client, \
            client.chat.completions.with_streaming_response.create(
                model="held", stream=True, messages=[{"role": "user", "content": "hi"}]
            ) as response:
        assert response.status_code == 200 and not upstream.sent.is_set()
        assert response.headers["content-type"].startswith("text/event-stream")
        upstream.release.set()
        text = "".join(c.choices[0].delta.content or "" for c in response.parse() if c.choices)
    assert text == "held"


def test_an_anthropic_client_gets_the_head_before_the_first_token_too(
        held: tuple[HeldFirstEvent, GatewayServer]) -> None:
    upstream, gw = held
    with anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0) as client, \
            client.messages.with_streaming_response.create(
                model="held", max_tokens=16, stream=True,
                messages=[{"role": "user", "content": "hi"}]) as response:
        assert response.status_code == 200 and not upstream.sent.is_set()
        upstream.release.set()
        events = "".join(response.iter_text())
    assert events.startswith("event: message_start") and '"text":"held"' in events


def test_an_anthropic_client_gets_message_start_before_the_first_token(
        held: tuple[HeldFirstEvent, GatewayServer]) -> None:
    upstream, gw = held
    with anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0) as client, \
            client.messages.stream(model="held", max_tokens=16,
                                   messages=[{"role": "user", "content": "hi"}]) as stream:
        first = next(iter(stream))
        assert first.type == "message_start" and not upstream.sent.is_set()
        assert first.message.model == "m" and first.message.id.startswith("msg_")
        upstream.release.set()
        assert stream.get_final_text() == "held"


@pytest.fixture
def held_cached(make_gateway: Callable[..., GatewayServer]
                ) -> Iterator[tuple[HeldFirstEvent, GatewayServer]]:
    upstream = HeldFirstEvent()
    with ServerThread(upstream) as srv:
        yield upstream, make_gateway(
            HELD.format(url=srv.url) + '[cache]\nenabled = true\nbackend = "memory"\n'
            'semantic = false\n', policy=DEFAULT_POLICY + "[cache]\nenabled = true\n")
        upstream.release.set()


def test_an_early_message_start_is_sent_once_kept_by_the_cache_and_shared(
        held_cached: tuple[HeldFirstEvent, GatewayServer]) -> None:
    upstream, gw = held_cached
    body = {"model": "held", "max_tokens": 16, "stream": True, "extra_body": {
        "temperature": 0}, "messages": [{"role": "user", "content": "once?"}]}

    async def coalesced() -> list[str]:
        async with anthropic.AsyncAnthropic(base_url=gw.url, api_key="k",
                                            max_retries=0) as client:
            async def one() -> str:
                async with client.messages.with_streaming_response.create(**body) as r:
                    return "".join([t async for t in r.iter_text()])
            before = gw.gateway.flights.joined
            tasks = [asyncio.ensure_future(one()) for _ in range(3)]
            deadline = time.monotonic() + 10
            while gw.gateway.flights.joined < before + 2:  # both followers are in
                assert time.monotonic() < deadline, "the followers did not join"
                await asyncio.sleep(0.005)
            upstream.release.set()
            return await asyncio.gather(*tasks)

    streams = asyncio.run(coalesced())
    with anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0) as client, \
            client.messages.with_streaming_response.create(**body) as response:
        assert response.headers["x-cache"] == "hit"
        streams.append("".join(response.iter_text()))
    for events in streams:  # the leader's, two followers', the cache's
        assert events.startswith("event: message_start")
        assert events.count("event: message_start") == 1 and '"text":"held"' in events
        assert events.rstrip().endswith('data: {"type":"message_stop"}')


def test_a_refusal_before_the_first_byte_keeps_its_status(
        held: tuple[HeldFirstEvent, GatewayServer]) -> None:
    upstream, gw = held
    upstream.status = 400
    with openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0) as client, \
            pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="held", stream=True,
                                       messages=[{"role": "user", "content": "hi"}])
