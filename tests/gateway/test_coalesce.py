"""The coalesce stage through a running gateway, with the official SDKs as clients and the
fake upstream held until every client has joined: identical deterministic requests make one
upstream call and every client gets the whole, identical answer, whole or streamed; a late
joiner gets the stream from its first byte; a client leaving cancels nothing while another
waits, the last one leaving cancels the call."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import anthropic
import openai
import pytest

from gateway.testing.fake_upstream import FakeUpstream
from tests.conftest import DEFAULT_POLICY, GatewayServer


def until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait for ``check()`` (state the gateway reaches), failing after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def joined(gw: GatewayServer, n: int) -> Callable[[], bool]:
    return lambda: gw.gateway.flights.joined >= n


def ask(question: str, **kw: Any) -> dict[str, Any]:
    return {"model": "fake-model", "temperature": 0,
            "messages": [{"role": "user", "content": question}], **kw}


async def many(gw: GatewayServer, n: int, body: dict[str, Any], hold: str,
               stream: bool = False) -> list[Any]:
    async with openai.AsyncOpenAI(base_url=gw.v1, api_key="k", max_retries=0) as client:
        async def one() -> Any:
            raw = await client.chat.completions.with_raw_response.create(
                **body, stream=stream, extra_headers={"x-fake-hold": hold})
            if not stream:
                return raw.headers.get("x-gateway-coalesced"), raw.parse()
            chunks = [c async for c in raw.parse()]
            return raw.headers.get("x-gateway-coalesced"), "".join(
                c.choices[0].delta.content or "" for c in chunks if c.choices)
        return await asyncio.gather(*(one() for _ in range(n)))


def test_identical_requests_share_one_call_whole_and_streamed(gw: GatewayServer,
                                                              fake: FakeUpstream) -> None:
    for stream in (False, True):
        fake.clear()
        hold = uuid.uuid4().hex
        before = gw.gateway.flights.joined

        async def go(stream: bool = stream, hold: str = hold, before: int = before
                     ) -> list[Any]:
            task = asyncio.ensure_future(many(gw, 20, ask("Same?"), hold, stream))
            await asyncio.to_thread(until, joined(gw, before + 19))
            fake.release(hold)
            return await task
        answers = asyncio.run(go())
        assert len(fake.records) == 1  # one upstream call for 20 clients
        texts = [a[1] if stream else a[1].choices[0].message.content for a in answers]
        assert texts == ["w0 w1 w2 w3 w4 w5 w6 w7"] * 20
        assert sorted(h for h, _ in answers if h) == ["1"] * 19
    logs = gw.logged(40)
    assert sorted(r["coalesced"] for r in logs) == ["follower"] * 38 + ["leader"] * 2
    assert all(r["status"] == 200 and r["upstream"] == "fake" for r in logs)
    metrics = gw.gateway.metrics.render().decode()
    assert 'gateway_coalesced_requests_total{role="follower"} 38.0' in metrics


def test_a_late_joiner_gets_the_stream_from_its_first_byte(gw: GatewayServer,
                                                           fake: FakeUpstream) -> None:
    async def go() -> tuple[str, str]:
        async with openai.AsyncOpenAI(base_url=gw.v1, api_key="k", max_retries=0) as c:
            first = await c.chat.completions.create(
                **ask("Count"), stream=True,
                extra_headers={"x-fake-tokens": "30", "x-fake-itl-ms": "20"})
            seen = []
            async for chunk in first:  # a few pieces in, a second client asks the same
                seen.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
                if len(seen) == 5:
                    break
            late = await c.chat.completions.create(**ask("Count"), stream=True)
            rest = [ch async for ch in first]
            seen += [ch.choices[0].delta.content or "" for ch in rest if ch.choices]
            text = "".join([ch.choices[0].delta.content or "" async for ch in late
                            if ch.choices])
            return "".join(seen), text
    early, late = asyncio.run(go())
    assert early == late == " ".join(f"w{i}" for i in range(30))
    assert len(fake.records) == 1
    assert [r["coalesced"] for r in gw.logged(2)] in (["leader", "follower"],
                                                      ["follower", "leader"])


def test_a_client_leaving_cancels_only_when_it_is_the_last(gw: GatewayServer,
                                                          fake: FakeUpstream) -> None:
    hold = uuid.uuid4().hex

    async def go() -> Any:
        async with openai.AsyncOpenAI(base_url=gw.v1, api_key="k", max_retries=0) as c:
            async def ask_one() -> Any:
                return await c.chat.completions.create(
                    **ask("Wait"), extra_headers={"x-fake-hold": hold})
            leaving, staying = asyncio.ensure_future(ask_one()), asyncio.ensure_future(
                ask_one())
            await asyncio.to_thread(until, lambda: gw.gateway.flights.joined >= 1)
            leaving.cancel()  # the first client leaves: its connection closes
            await asyncio.to_thread(until, lambda: len(gw.sink.records) >= 1)
            assert fake.records[0].disconnected is None  # the call goes on for the other
            fake.release(hold)
            return await staying
    answer = asyncio.run(go())
    assert answer.choices[0].message.content == "w0 w1 w2 w3 w4 w5 w6 w7"
    assert sorted(r["status"] for r in gw.logged(2)) == [200, 499]
    # now both leave: the last one's leaving cancels the call upstream
    fake.clear()
    hold = uuid.uuid4().hex

    async def both_leave() -> None:
        async with openai.AsyncOpenAI(base_url=gw.v1, api_key="k", max_retries=0) as c:
            tasks = [asyncio.ensure_future(c.chat.completions.create(
                **ask("Gone"), extra_headers={"x-fake-hold": hold})) for _ in range(2)]
            await asyncio.to_thread(until, lambda: gw.gateway.flights.joined >= 2)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    asyncio.run(both_leave())
    fake.wait_for(lambda recs: len(recs) == 1 and recs[0].disconnected is not None)


def test_what_is_not_shared(make_gateway: Callable[..., GatewayServer],
                            fake: FakeUpstream) -> None:
    """Sampled requests, different ones, other keys' and the stage off: each its own call."""
    gw = make_gateway()
    cases: list[tuple[dict[str, Any], int]] = [
        (ask("Hi", temperature=1), 3), ({**ask("Hi"), "n": 2}, 3)]
    for body, calls in cases:
        fake.clear()
        hold = uuid.uuid4().hex

        async def go(body: dict[str, Any] = body, hold: str = hold) -> None:
            task = asyncio.ensure_future(many(gw, 3, body, hold))
            await asyncio.to_thread(fake.wait_for, lambda recs: len(recs) == 3)
            fake.release(hold)
            await task
        asyncio.run(go())
        assert len(fake.records) == calls
    off = make_gateway(policy=DEFAULT_POLICY + "\n[coalesce]\nenabled = false\n")
    fake.clear()
    hold = uuid.uuid4().hex

    async def go_off() -> None:
        task = asyncio.ensure_future(many(off, 5, ask("Same"), hold))
        await asyncio.to_thread(fake.wait_for, lambda recs: len(recs) == 5)
        fake.release(hold)
        await task
    asyncio.run(go_off())
    assert len(fake.records) == 5


def test_always_shares_sampled_requests_and_anthropic_clients_coalesce_too(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream) -> None:
    gw = make_gateway(policy=DEFAULT_POLICY + '\n[coalesce]\nmode = "always"\n')
    hold = uuid.uuid4().hex

    async def go() -> list[Any]:
        async with anthropic.AsyncAnthropic(base_url=gw.url, api_key="k",
                                            max_retries=0) as c:
            tasks = [asyncio.ensure_future(c.messages.create(
                model="fake-model", max_tokens=16, messages=[
                    {"role": "user", "content": "Sampled?"}],
                extra_headers={"x-fake-hold": hold})) for _ in range(4)]
            await asyncio.to_thread(until, lambda: gw.gateway.flights.joined >= 3)
            fake.release(hold)
            return await asyncio.gather(*tasks)
    messages = asyncio.run(go())
    assert len(fake.records) == 1
    assert {m.content[0].text for m in messages} == {"w0 w1 w2 w3 w4 w5 w6 w7"}


@pytest.mark.parametrize("stream", [False, True])
def test_an_upstream_error_reaches_every_client(gw: GatewayServer, fake: FakeUpstream,
                                                stream: bool) -> None:
    hold = uuid.uuid4().hex

    async def go() -> list[Any]:
        async with openai.AsyncOpenAI(base_url=gw.v1, api_key="k", max_retries=0) as c:
            tasks = [asyncio.ensure_future(c.chat.completions.create(
                **ask("Fail"), stream=stream, extra_headers={
                    "x-fake-hold": hold, "x-fake-status": "400"})) for _ in range(3)]
            await asyncio.to_thread(until, lambda: gw.gateway.flights.joined >= 2)
            fake.release(hold)
            return await asyncio.gather(*tasks, return_exceptions=True)
    errors = asyncio.run(go())
    assert [type(e) for e in errors] == [openai.BadRequestError] * 3
    assert len(fake.records) == 1
