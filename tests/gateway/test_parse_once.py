"""Each body is parsed at most once per request: the request, an upstream's whole answer, a
cached entry (issue 28, item 3).

Every body the request path reads goes through :func:`gateway.jsonio.loads`; a profile hook
on the gateway's event-loop thread sees each call and the bytes it was given (nothing is
patched: the hook only watches). Per path, the parses are counted and each body must be
among them at most once. Before this was so, a unary answer was parsed twice (the log's
usage, the cache's answer), a translated one three times (the log's usage, the
translation, the cache's answer of the translated body) and a semantic hit's entry twice.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from types import FrameType
from typing import Any, Self

import anthropic
import httpx
import openai
import pytest

from gateway import jsonio
from gateway.testing.fake_anthropic import FakeAnthropic
from gateway.testing.fake_upstream import FakeUpstream
from tests.conftest import DEFAULT_POLICY, GatewayServer

KEY_ENV = "GATEWAY_TEST_PARSE_ONCE_KEY"
HELLO = [{"role": "user", "content": "Say hi"}]
#: The exact cache on (its store reads the answer; its hit reads an entry), nothing else
#: that would change the request.
POLICY = DEFAULT_POLICY + """
[cache]
enabled = true
semantic = false
[prompt_cache]
enabled = false
"""

_LOADS = jsonio.loads.__code__


class Parses:
    """The bodies ``gateway.jsonio.loads`` parsed on the gateway's loop thread."""

    def __init__(self, gw: GatewayServer) -> None:
        self.gw = gw
        self.bodies: list[bytes] = []

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is _LOADS:
            self.bodies.append(bytes(frame.f_locals["data"]))

    async def _set(self, on: bool) -> None:
        sys.setprofile(self._profile if on else None)  # this thread's: the gateway's loop

    def __enter__(self) -> Self:
        self.gw.run(self._set(True))
        return self

    def __exit__(self, *exc: object) -> None:
        self.gw.run(self._set(False))

    def take(self, requests: int = 1) -> list[bytes]:
        """The bodies parsed by the requests so far (once their log lines are written and
        the cache's background stores done), each at most once."""
        self.gw.logged(requests)
        cache = self.gw.gateway.cache
        if cache is not None:
            self.gw.run(cache.drain())
        bodies, self.bodies = self.bodies, []
        twice = [body[:80] for body, n in Counter(bodies).items() if n > 1]
        assert not twice, f"parsed more than once: {twice}"
        return bodies


@pytest.fixture
def gw(make_gateway: Callable[..., GatewayServer], claude_server: tuple[FakeAnthropic, str],
       monkeypatch: pytest.MonkeyPatch) -> GatewayServer:
    monkeypatch.setenv(KEY_ENV, "sk-ant-upstream")
    return make_gateway(f"""
[cache]
enabled = true
backend = "memory"

[upstreams.claude]
type = "anthropic"
base_url = "{claude_server[1]}"
api_key_env = "{KEY_ENV}"

[models.claude]
targets = [{{ upstream = "claude", model = "claude-upstream" }}]
""", policy=POLICY)


def openai_client(gw: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0)


def anthropic_client(gw: GatewayServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0)


def test_unary_chat_parses_the_request_and_the_answer_once(gw: GatewayServer,
                                                          fake: FakeUpstream) -> None:
    with Parses(gw) as parses, openai_client(gw) as c:
        r = c.chat.completions.with_raw_response.create(model="fake-model", messages=HELLO)
        bodies = parses.take()
    assert r.headers["x-cache"] == "miss"  # and its answer was stored, from the same parse
    assert len(bodies) == 2  # the request, the upstream's answer
    assert r.parse().choices[0].message.content == "w0 w1 w2 w3 w4 w5 w6 w7"


def test_a_stream_parses_only_the_request(gw: GatewayServer, fake: FakeUpstream) -> None:
    with Parses(gw) as parses, httpx.stream(
            "POST", gw.v1 + "/chat/completions",
            json={"model": "fake-model", "messages": HELLO, "stream": True}) as r:
        assert r.read().endswith(b"data: [DONE]\n\n")
        bodies = parses.take()
    assert len(bodies) == 1  # the request (events are read as they pass, not as bodies)


def test_an_exact_hit_parses_the_request_and_the_entry_once(gw: GatewayServer,
                                                           fake: FakeUpstream) -> None:
    with openai_client(gw) as c:
        c.chat.completions.create(model="fake-model", messages=HELLO)
        gw.logged(1)
        gw.run(gw.gateway.cache.drain())  # type: ignore[union-attr]
        with Parses(gw) as parses:
            r = c.chat.completions.with_raw_response.create(model="fake-model",
                                                            messages=HELLO)
            bodies = parses.take(2)
    assert r.headers["x-cache"] == "hit"
    assert len(bodies) == 2  # the request, the stored entry
    assert len(fake.records) == 1


@pytest.mark.parametrize("client", ["openai", "anthropic"])
def test_a_translated_answer_is_parsed_once(gw: GatewayServer, fake: FakeUpstream,
                                            claude_server: tuple[FakeAnthropic, str],
                                            client: str) -> None:
    """An OpenAI client calling Claude, and an Anthropic client calling an OpenAI-style
    upstream: the upstream's answer is parsed once, for the log, the translation and the
    cache alike (the translated answer is never parsed back)."""
    with Parses(gw) as parses:
        if client == "openai":
            with openai_client(gw) as c:
                r = c.chat.completions.with_raw_response.create(model="claude",
                                                                messages=HELLO)
            text = r.parse().choices[0].message.content
        else:
            with anthropic_client(gw) as a:
                r = a.messages.with_raw_response.create(model="fake-model", max_tokens=32,
                                                        messages=HELLO)
            text = r.parse().content[0].text
        bodies = parses.take()
    assert r.headers["x-cache"] == "miss"
    assert text
    assert len(bodies) == 2  # the request, the upstream's answer
    [rec] = gw.logged()
    assert rec["completion_tokens"] == 8 and rec["finish_reason"] == "stop"
