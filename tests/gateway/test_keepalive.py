"""A stream whose first event is slow to come (a long prefill, a queue) is kept alive: its
headers and an SSE comment go out after ``[streaming] keepalive_s``, then a comment as often,
so idle-cutting proxies keep it; the answer, or an error event, follows. The SDKs read it as
any stream."""

from __future__ import annotations

from collections.abc import Callable

import anthropic
import httpx
import openai
import orjson
import pytest

from gateway.testing.fake_upstream import FakeUpstream
from tests.conftest import DEFAULT_POLICY, GatewayServer

KEEPALIVE = DEFAULT_POLICY + "\n[streaming]\nkeepalive_s = 0.05\n"
SLOW = {"x-fake-ttft-ms": "400"}
BODY = {"model": "fake-model", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def gw(make_gateway: Callable[..., GatewayServer]) -> GatewayServer:
    return make_gateway(policy=KEEPALIVE)


def lines(gw: GatewayServer, headers: dict[str, str]) -> list[str]:
    with httpx.Client(timeout=10) as c, c.stream("POST", gw.v1 + "/chat/completions",
                                                 json=BODY, headers=headers) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        return [line for line in r.iter_lines() if line]


def test_comments_keep_a_slow_stream_alive_then_the_answer_comes(gw: GatewayServer,
                                                                 fake: FakeUpstream) -> None:
    sent = lines(gw, SLOW)
    first_data = next(i for i, line in enumerate(sent) if line.startswith("data:"))
    assert first_data >= 2 and set(sent[:first_data]) == {": keepalive"}
    assert sent[-1] == "data: [DONE]"
    with openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0) as client:
        stream = client.chat.completions.create(
            **BODY, extra_headers=SLOW)  # type: ignore[call-overload]
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "w0 w1 w2 w3 w4 w5 w6 w7"
    log = gw.logged(2)[-1]
    assert log["status"] == 200 and log["ttft_ms"] >= 400  # the comments are not a token


def test_a_quick_stream_gets_no_comment(gw: GatewayServer, fake: FakeUpstream) -> None:
    assert not any(line.startswith(":") for line in lines(gw, {}))


def test_an_error_after_the_comments_ends_the_stream_as_an_error_event(
        gw: GatewayServer, fake: FakeUpstream) -> None:
    sent = lines(gw, {**SLOW, "x-fake-status": "400", "x-fake-error-code": "bad_thing"})
    assert sent[0] == ": keepalive"
    error = orjson.loads(sent[-1].removeprefix("data: "))["error"]
    assert error["code"] == "bad_thing" and "[DONE]" not in sent[-1]
    assert gw.logged(1)[0]["error_code"] == "bad_thing"


def test_an_anthropic_stream_is_kept_alive_too(gw: GatewayServer, fake: FakeUpstream) -> None:
    with anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0) as client, \
            client.messages.stream(model="fake-model", max_tokens=16, messages=[
                {"role": "user", "content": "hi"}], extra_headers=SLOW) as stream:
        text = "".join(stream.text_stream)
    assert text == "w0 w1 w2 w3 w4 w5 w6 w7"
