"""The bridge: a table of the two directions, each behind the same small interface, and an
upstream's stream seen through a direction's translator."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
import pytest

from gateway.errors import InvalidRequest
from gateway.formats.anthropic_to_openai import AnthropicStreamFromOpenAI, AnthropicToOpenAI
from gateway.formats.bridge import TranslatedStream, bridge
from gateway.formats.openai_to_anthropic import OpenAIToAnthropic
from tests.gateway.formats.translation import anthropic_error_body, openai_error_body, run


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_the_same_api_needs_no_bridge(api):
    assert bridge(api, api, "chat") is None
    assert bridge(api, api, "embeddings") is None


@pytest.mark.parametrize("kind", ["completions", "embeddings"])
def test_only_the_chat_endpoints_cross(kind):
    with pytest.raises(InvalidRequest) as caught:
        bridge("openai", "anthropic", kind)
    assert (caught.value.status, caught.value.code) == (400, "unsupported_endpoint")
    assert f"/v1/{kind} is not available" in caught.value.message


@pytest.mark.parametrize(("client", "upstream", "direction", "path"), [
    ("openai", "anthropic", OpenAIToAnthropic, "/v1/messages"),
    ("anthropic", "openai", AnthropicToOpenAI, "/chat/completions"),
])
def test_each_pair_is_its_direction_with_the_upstreams_chat_path(client, upstream, direction,
                                                                 path):
    crossing = bridge(client, upstream, "chat")
    assert isinstance(crossing, direction)
    assert crossing.path == path
    assert crossing.stream() is not crossing.stream()  # one translator per answer


def test_overload_is_each_clients_own_status():
    status, body = bridge("openai", "anthropic", "chat").error(
        529, orjson.loads(anthropic_error_body("overloaded_error", "Overloaded")))
    assert status == 503  # what an OpenAI client knows (and its SDK retries)
    assert body["error"]["code"] == "overloaded"
    status, body = bridge("anthropic", "openai", "chat").error(
        503, orjson.loads(openai_error_body("busy")))
    assert status == 529  # what an Anthropic client knows
    assert body["error"]["type"] == "overloaded_error"
    for client, upstream, error in [
            ("openai", "anthropic", anthropic_error_body("rate_limit_error", "slow")),
            ("anthropic", "openai", openai_error_body("slow", "requests"))]:
        crossing = bridge(client, upstream, "chat")
        assert crossing is not None
        assert crossing.error(429, orjson.loads(error))[0] == 429  # other statuses are kept


def chunk(delta: dict[str, object], finish: str | None = None) -> bytes:
    return b"data: " + orjson.dumps({
        "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}) + b"\n\n"


class Upstream:
    """An opened upstream stream: its first bytes, the rest as they come, finish and close."""

    def __init__(self, first: bytes, rest: list[bytes]) -> None:
        self.first = first
        self.chunks = self._chunks(rest)
        self.finished = False
        self.closed: bool | None = None

    async def _chunks(self, rest: list[bytes]) -> AsyncIterator[bytes]:
        for piece in rest:
            yield piece

    async def finish(self) -> None:
        self.finished = True

    def close(self, failed: bool = False) -> None:
        self.closed = failed


async def test_a_translated_stream_is_the_whole_stream_translated():
    body = (chunk({"role": "assistant", "content": ""}) + chunk({"content": "Hi"})
            + chunk({}, "stop") + b"data: [DONE]")  # the last event unterminated: flushed
    upstream = Upstream(body[:40], [body[40:100], body[100:]])
    crossing = bridge("anthropic", "openai", "chat")
    assert crossing is not None
    stream = TranslatedStream(upstream, crossing.stream())
    out = stream.first + b"".join([piece async for piece in stream.chunks])
    assert out == run(AnthropicStreamFromOpenAI(), body)
    assert out.endswith(b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
    await stream.finish()
    stream.close(True)
    assert (upstream.finished, upstream.closed) == (True, True)
