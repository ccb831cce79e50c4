"""/v1/responses' state: ``previous_response_id`` chains, ``store``, and
``GET``/``DELETE /v1/responses/{id}`` and ``input_items``, with the official openai SDK as
the client, on an upstream that keeps nothing (the fake's chat endpoint, the fake
Anthropic), in memory and in Redis."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Iterator
from typing import Any

import openai
import orjson
import pytest

from gateway.response_store.records import MemoryRecords
from gateway.testing.fake_anthropic import FakeAnthropic
from gateway.testing.fake_upstream import FakeUpstream
from gateway.testing.redis_server import RedisServer
from tests.conftest import GatewayServer


def sdk(gw: GatewayServer, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.v1, api_key=key, max_retries=0)


def sent_messages(fake: FakeUpstream, i: int = -1) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = orjson.loads(fake.records[i].body)["messages"]
    return messages


def test_a_chain_of_three_turns_sends_the_whole_conversation(gw: GatewayServer,
                                                             fake: FakeUpstream) -> None:
    brief = "Be brief."
    with sdk(gw) as client:
        one = client.responses.create(model="fake-model", input="My name is Ada.",
                                      instructions=brief)
        two = client.responses.create(model="fake-model", input="What is my name?",
                                      previous_response_id=one.id, instructions=brief)
        with client.responses.stream(model="fake-model", input="Spell it.",
                                     previous_response_id=two.id,
                                     instructions=brief) as stream:
            three = stream.get_final_response()
        four = client.responses.create(model="fake-model", input="Thanks.",
                                       previous_response_id=three.id)
    answer = "w0 w1 w2 w3 w4 w5 w6 w7"
    assert three.output_text == four.output_text == answer
    assert sent_messages(fake, 2) == [
        {"role": "system", "content": brief},
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "What is my name?"},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "Spell it."}]
    # the rebuilt prefix is byte-stable: turn 2's messages, then its answer, start turn 3's
    second, third = (fake.records[i].body for i in (1, 2))
    assert second.endswith(b"]}")  # {"model": ..., "messages": [...]}
    assert third.startswith(second[:-2] + b',{"role":"assistant"')
    # instructions are the request's own: a previous response's are not carried over
    assert [m["role"] for m in sent_messages(fake, 3)] == ["user", "assistant"] * 3 + ["user"]
    assert [r.path for r in fake.records] == ["/v1/chat/completions"] * 4


def test_a_stored_response_is_retrieved_listed_and_deleted(gw: GatewayServer,
                                                           fake: FakeUpstream) -> None:
    with sdk(gw) as client:
        one = client.responses.create(model="fake-model", input="First.")
        two = client.responses.create(model="fake-model", previous_response_id=one.id,
                                      input=[{"role": "user", "content": "Second."}])
        got = client.responses.retrieve(two.id)
        assert got.id == two.id and got.output_text == two.output_text
        assert got.previous_response_id == one.id
        items = client.responses.input_items.list(two.id)
        texts = [item.content[0].text for item in items.data  # type: ignore[union-attr]
                 if item.type == "message"]
        assert texts == ["Second.", "w0 w1 w2 w3 w4 w5 w6 w7", "First."]  # newest first
        page = client.responses.input_items.list(two.id, order="asc", limit=1)
        assert [i.id for i in page.data] == [items.data[-1].id] and page.has_more
        with pytest.raises(openai.BadRequestError):  # nothing here runs in the background
            client.responses.cancel(two.id)
        deleted = client.responses.delete(two.id)
        assert deleted is None or getattr(deleted, "deleted", True)
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(two.id)
        with pytest.raises(openai.BadRequestError) as err:
            client.responses.create(model="fake-model", input="Third.",
                                    previous_response_id=two.id)
    assert err.value.code == "previous_response_not_found"
    assert err.value.param == "previous_response_id"
    assert len(fake.records) == 2  # the refused turn never reached the upstream


def test_store_false_keeps_nothing(gw: GatewayServer, fake: FakeUpstream) -> None:
    with sdk(gw) as client:
        r = client.responses.create(model="fake-model", input="Forget me.", store=False)
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(r.id)


def test_an_unknown_or_failed_response_cannot_be_continued(gw: GatewayServer,
                                                           fake: FakeUpstream) -> None:
    with sdk(gw) as client:
        with pytest.raises(openai.BadRequestError) as err:
            client.responses.create(model="fake-model", input="x",
                                    previous_response_id="resp_nope")
        assert err.value.code == "previous_response_not_found"
        with pytest.raises(openai.InternalServerError):  # an upstream error is not stored
            client.responses.create(model="fake-model", input="x",
                                    extra_headers={"x-fake-status": "500"})
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve("resp_../../etc")
    assert all(r.path != "/v1/responses" for r in fake.records)


def test_one_key_never_reads_another_keys_responses(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream) -> None:
    keys = "".join(f'\n[[auth.keys]]\nid = "{k}"\n'
                   f'sha256 = "{hashlib.sha256(k.encode()).hexdigest()}"\n'
                   for k in ("team-a", "team-b"))
    gw = make_gateway(keys)
    with sdk(gw, "team-a") as a, sdk(gw, "team-b") as b:
        mine = a.responses.create(model="fake-model", input="A secret.")
        assert a.responses.retrieve(mine.id).id == mine.id
        with pytest.raises(openai.NotFoundError):
            b.responses.retrieve(mine.id)
        with pytest.raises(openai.NotFoundError):
            b.responses.input_items.list(mine.id)
        with pytest.raises(openai.NotFoundError):
            b.responses.delete(mine.id)
        with pytest.raises(openai.BadRequestError):
            b.responses.create(model="fake-model", input="x", previous_response_id=mine.id)
        with pytest.raises(openai.AuthenticationError):
            sdk(gw, "wrong").responses.retrieve(mine.id)
        assert a.responses.retrieve(mine.id).output_text == mine.output_text


def test_an_anthropic_upstream_continues_a_conversation(
        with_claude: tuple[GatewayServer, FakeAnthropic]) -> None:
    gw, claude = with_claude
    with sdk(gw) as client:
        one = client.responses.create(model="claude", input="Hello.")
        two = client.responses.create(model="claude", input="Again.",
                                      previous_response_id=one.id)
        three = client.responses.create(model="claude", input="Once more.",
                                        previous_response_id=two.id, stream=True)
        final = next(e for e in three if e.type == "response.completed").response
        assert client.responses.retrieve(final.id).output_text == final.output_text
    sent = orjson.loads(claude.records[-1].body)["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant"] * 2 + ["user"]


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def test_replicas_sharing_redis_continue_each_others_conversations(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream,
        redis_server: RedisServer) -> None:
    shared = f'\n[responses]\nstore = "redis"\nredis_url = "{redis_server.url}"\nttl_s = 60\n'
    first, second = make_gateway(shared), make_gateway(shared)
    with sdk(first) as a, sdk(second) as b:
        one = a.responses.create(model="fake-model", input="Remember 42.")
        # the write lands after the answer: wait for it rather than for luck
        first.run(first.gateway.responses.record(None, one.id))
        two = b.responses.create(model="fake-model", input="Which number?",
                                 previous_response_id=one.id)
        assert b.responses.retrieve(two.id).previous_response_id == one.id
    assert sent_messages(fake)[0] == {"role": "user", "content": "Remember 42."}


def test_memory_records_expire_and_stay_within_their_bytes() -> None:
    now = [0.0]
    records = MemoryRecords(max_bytes=10, clock=lambda: now[0])

    async def go() -> None:
        await records.put("a", b"12345", ttl_s=5)
        await records.put("b", b"12345", ttl_s=50)
        assert await records.get("a") == b"12345"
        await records.put("c", b"123", ttl_s=50)  # over 10 bytes: "b", least recent, goes
        assert await records.get("b") is None and await records.get("a") == b"12345"
        now[0] = 6.0
        assert await records.get("a") is None and await records.get("c") == b"123"
        assert records.size == 3
    asyncio.run(go())


def test_memory_records_keep_each_keys_share() -> None:
    records = MemoryRecords(max_bytes=100, share=0.5)

    async def go() -> None:
        await records.put("a:1", b"a" * 30, ttl_s=50, tenant="a")
        for i in range(5):  # b's writes past its 50 bytes evict b's own
            await records.put(f"b:{i}", b"b" * 20, ttl_s=50, tenant="b")
        assert await records.get("a:1") == b"a" * 30
        assert [await records.get(f"b:{i}") is not None for i in range(5)] == [
            False, False, False, True, True]
        assert records.size == 70
    asyncio.run(go())


def test_an_anthropic_upstream_parses_json_schema_and_round_trips_a_tool(
        with_claude: tuple[GatewayServer, FakeAnthropic]) -> None:
    from pydantic import BaseModel

    class Weather(BaseModel):
        city: str
        celsius: int

    gw, claude = with_claude
    tools: Any = [{"type": "function", "name": "weather", "strict": False,
                   "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}]
    with sdk(gw) as client:
        parsed = client.responses.parse(model="claude", input="Paris?", text_format=Weather)
        first = client.responses.create(model="claude", input="Weather?", tools=tools,
                                        extra_headers={"x-fake-tool": "1"})
        [call] = [item for item in first.output if item.type == "function_call"]
        second = client.responses.create(
            model="claude", tools=tools, previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": call.call_id,
                    "output": "Sunny"}])
    assert isinstance(parsed.output_parsed, Weather)
    assert claude.records[0].json["output_config"]["format"]["type"] == "json_schema"
    assert call.name == "weather" and second.output_text
    sent = claude.records[-1].json["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[1]["content"][-1]["type"] == "tool_use"
    assert sent[2]["content"][0] == {"type": "tool_result", "content": "Sunny",
                                     "tool_use_id": sent[1]["content"][-1]["id"]}


def test_what_only_openai_holds_is_refused_on_a_chat_upstream(gw: GatewayServer,
                                                              fake: FakeUpstream) -> None:
    with sdk(gw) as client:
        held: Any
        for held in ({"conversation": "conv_1"}, {"prompt": {"id": "pmpt_1"}}):
            with pytest.raises(openai.BadRequestError) as err:
                client.responses.create(model="fake-model", input="hi", **held)
            assert err.value.param == next(iter(held))
    assert fake.records == []


def test_a_store_that_does_not_answer_costs_the_chain_not_the_answer(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream) -> None:
    gw = make_gateway('\n[responses]\nstore = "redis"\nredis_url = "redis://127.0.0.1:9/0"\n')
    with sdk(gw) as client:
        r = client.responses.create(model="fake-model", input="Hi")  # its write fails: logged
        assert r.output_text
        with pytest.raises(openai.InternalServerError) as err:
            client.responses.create(model="fake-model", input="Again",
                                    previous_response_id=r.id)
        assert err.value.status_code == 503
        assert err.value.code == "response_store_unavailable"
        with pytest.raises(openai.InternalServerError):
            client.responses.retrieve(r.id)
    assert len(fake.records) == 1
