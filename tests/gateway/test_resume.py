"""Streams a client can resume (issue 48, item 4): with ``[streaming] resume`` on, every
event carries an ``id:``; a client whose connection dropped sends the request again with
``x-gateway-stream-id`` and ``Last-Event-ID`` (a Responses client: ``GET
/v1/responses/{id}?stream=true&starting_after=N``) and gets exactly the events it missed,
then the rest live; a client that does not come back still cancels the upstream after the
grace period; another key gets the 404 an unknown stream gets."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import anthropic
import httpx
import openai
import orjson
import pytest

from gateway.testing.fake_upstream import FakeUpstream, Record
from tests.conftest import DEFAULT_POLICY, GatewayServer

RESUME = DEFAULT_POLICY + "\n[streaming]\nresume = true\nresume_grace_ms = {grace}\n"
CHAT = {"model": "fake-model", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
SLOW = {"x-fake-itl-ms": "40"}  # 8 chunks, 40 ms apart: a client can leave midway
TEXT = "w0 w1 w2 w3 w4 w5 w6 w7"
KEYS = """
[[auth.keys]]
id = "alice"
sha256 = "{a}"

[[auth.keys]]
id = "bob"
sha256 = "{b}"
"""


@pytest.fixture
def gw(make_gateway: Callable[..., GatewayServer]) -> GatewayServer:
    return make_gateway(policy=RESUME.format(grace=5000))


def events(body: str) -> list[tuple[int | None, str]]:
    """(id, the event without its id line) for each event of an SSE body."""
    out = []
    for raw in body.split("\n\n"):
        if not raw.strip():
            continue
        lines = raw.split("\n")
        ids = [int(line[4:]) for line in lines if line.startswith("id: ")]
        out.append((ids[-1] if ids else None,
                    "\n".join(line for line in lines if not line.startswith("id: "))))
    return out


def first_leg(gw: GatewayServer, n: int, headers: dict[str, str] | None = None,
              path: str = "/chat/completions", body: dict[str, object] = CHAT
              ) -> tuple[str, str]:
    """Read the first ``n`` events of a stream, then drop the connection; returns the
    stream's id and what was read."""
    read = ""
    with httpx.Client(timeout=10) as c, c.stream(
            "POST", gw.v1 + path, json=body, headers={**SLOW, **(headers or {})}) as r:
        assert r.status_code == 200
        sid = r.headers["x-gateway-stream-id"]
        for chunk in r.iter_text():
            read += chunk
            if len(events(read)) >= n and read.endswith("\n\n"):
                break
    return sid, read  # leaving the block closes the connection mid-body


def resume(gw: GatewayServer, sid: str, last: int | None, path: str = "/chat/completions",
           headers: dict[str, str] | None = None) -> httpx.Response:
    extra = {"x-gateway-stream-id": sid, **(headers or {})}
    if last is not None:
        extra["last-event-id"] = str(last)
    return httpx.post(gw.v1 + path, json=CHAT, headers=extra, timeout=10)


def whole(gw: GatewayServer) -> str:
    return httpx.post(gw.v1 + "/chat/completions", json=CHAT, timeout=10).text


def chat_text(body: str) -> str:
    text = ""
    for _, event in events(body):
        data = event.removeprefix("data: ")
        if data != "[DONE]":
            text += "".join(c["delta"].get("content") or "" for c in orjson.loads(data)["choices"])
    return text


def test_every_event_carries_a_monotonic_id_and_comments_none(gw: GatewayServer,
                                                              fake: FakeUpstream) -> None:
    sent = events(whole(gw))
    assert [i for i, _ in sent] == list(range(len(sent)))
    assert sent[-1][1] == "data: [DONE]"
    with openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0) as client:
        stream = client.chat.completions.create(**CHAT)  # type: ignore[call-overload]
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == TEXT


def test_a_dropped_client_resumes_exactly_the_missed_events_then_the_rest_live(
        gw: GatewayServer, fake: FakeUpstream) -> None:
    sid, read = first_leg(gw, 3)
    got = events(read)
    last = got[-1][0]
    assert last is not None
    rest = resume(gw, sid, last)
    assert rest.status_code == 200 and rest.headers["x-gateway-stream-id"] == sid
    missed = events(rest.text)
    assert [i for i, _ in got + missed] == list(range(len(got) + len(missed)))  # no gap, no repeat
    assert [e for _, e in got + missed] == [e for _, e in events(whole(gw))]
    assert missed[-1][1] == "data: [DONE]"
    records = [r for r in fake.records if r.path.endswith("/chat/completions")]
    assert records[0].disconnected is None  # the upstream never saw the client leave
    assert len(records) == 2  # the resume made no upstream call (the second: whole())


def test_a_resume_without_last_event_id_replays_from_the_start(gw: GatewayServer,
                                                               fake: FakeUpstream) -> None:
    sid, _ = first_leg(gw, 1)
    assert chat_text(resume(gw, sid, None).text) == TEXT
    assert chat_text(resume(gw, sid, -1).text) == TEXT


def test_the_openai_sdk_reads_on_where_it_left(gw: GatewayServer, fake: FakeUpstream) -> None:
    with openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0) as client:
        raw = client.chat.completions.with_raw_response.create(
            **CHAT, extra_headers=SLOW)  # type: ignore[call-overload]
        sid = raw.headers["x-gateway-stream-id"]
        stream = raw.parse()
        text, seen = "", 0
        for chunk in stream:  # one event each: ids 0, 1, 2...
            text += chunk.choices[0].delta.content or ""
            seen += 1
            if seen == 4:
                break
        stream.close()  # the connection drops mid-stream
        rest = client.chat.completions.create(**CHAT, extra_headers={  # type: ignore[call-overload]
            "x-gateway-stream-id": sid, "last-event-id": str(seen - 1)})
        text += "".join(c.choices[0].delta.content or "" for c in rest if c.choices)
    assert text == TEXT


def test_the_anthropic_sdk_reads_on_where_it_left(gw: GatewayServer, fake: FakeUpstream) -> None:
    kwargs = {"model": "fake-model", "max_tokens": 64,
              "messages": [{"role": "user", "content": "hi"}]}
    with anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0) as client:
        raw = client.messages.with_raw_response.create(
            **kwargs, stream=True, extra_headers=SLOW)  # type: ignore[call-overload]
        sid = raw.headers["x-gateway-stream-id"]
        stream = raw.parse()
        kinds, text = [], ""
        for event in stream:  # no ping in a translated stream: one event each
            kinds.append(event.type)
            if event.type == "content_block_delta":
                text += event.delta.text
            if len(kinds) == 4:
                break
        stream.close()
        # (messages.stream() rebuilds the message from message_start: read the rest raw)
        rest = client.messages.create(**kwargs, stream=True, extra_headers={  # type: ignore[call-overload]
            "x-gateway-stream-id": sid, "last-event-id": str(len(kinds) - 1)})
        for event in rest:
            kinds.append(event.type)
            if event.type == "content_block_delta":
                text += event.delta.text
    assert text == TEXT
    assert kinds[0] == "message_start" and kinds.count("message_start") == 1
    assert kinds[-1] == "message_stop"


def test_a_responses_stream_resumes_by_its_response_id_and_sequence_number(
        gw: GatewayServer, fake: FakeUpstream) -> None:
    with openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0) as client:
        stream = client.responses.create(model="fake-model", input="hi", stream=True,
                                         extra_headers=SLOW)
        seen = []
        for event in stream:
            seen.append(event)
            if len(seen) == 5:
                break
        stream.close()
        rid = seen[0].response.id  # type: ignore[union-attr]
        rest = list(client.responses.retrieve(rid, stream=True,
                                              starting_after=seen[-1].sequence_number))
    numbers = [e.sequence_number for e in seen + rest]
    assert numbers == list(range(len(numbers)))
    assert rest[-1].type == "response.completed"
    assert rest[-1].response.output_text == TEXT
    raw = httpx.get(f"{gw.v1}/responses/{rid}?stream=true&starting_after=1", timeout=10)
    ids = [i for i, _ in events(raw.text)]
    assert ids[0] == 2 and ids[-1] == numbers[-1]  # an event's id is its sequence_number


def test_a_client_that_does_not_come_back_cancels_the_upstream_after_the_grace(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream) -> None:
    gw = make_gateway(policy=RESUME.format(grace=300))
    long = {"x-fake-itl-ms": "20", "x-fake-tokens": "400"}  # 8 s if never cancelled
    sid, _ = first_leg(gw, 2, long)
    at_drop = fake.records[-1].chunks_sent
    rec: Record = fake.wait_for(lambda rs: rs[-1].disconnected and rs[-1], timeout=5)
    assert rec.chunks_sent > at_drop  # it streamed on through the grace period...
    assert rec.chunks_sent < 400  # ...then was cancelled
    log = gw.logged(1)[0]
    assert log["status"] == 499 and log["cancelled"] is True
    late = events(resume(gw, sid, 1).text)  # what was kept, then an error: never a clean end
    assert late[0][0] == 2 and "[DONE]" not in late[-1][1]
    assert orjson.loads(late[-1][1].removeprefix("data: "))["error"]["code"] == \
        "stream_cancelled"


def test_a_zero_grace_cancels_at_once(make_gateway: Callable[..., GatewayServer],
                                      fake: FakeUpstream) -> None:
    gw = make_gateway(policy=RESUME.format(grace=0))
    first_leg(gw, 2, {"x-fake-itl-ms": "100", "x-fake-tokens": "400"})
    rec: Record = fake.wait_for(lambda rs: rs[-1].disconnected and rs[-1], timeout=5)
    assert rec.chunks_sent < 10  # 40 s of stream had it not been cancelled


def test_a_reader_holds_the_upstream_past_the_grace(make_gateway: Callable[..., GatewayServer],
                                                    fake: FakeUpstream) -> None:
    gw = make_gateway(policy=RESUME.format(grace=100))
    sid, read = first_leg(gw, 2, {"x-fake-itl-ms": "30", "x-fake-tokens": "30"})  # ~0.9 s
    rest = resume(gw, sid, events(read)[-1][0])
    assert events(rest.text)[-1][1] == "data: [DONE]"
    assert fake.records[-1].disconnected is None


def test_a_broken_stream_resumes_with_its_error_never_a_clean_end(gw: GatewayServer,
                                                                  fake: FakeUpstream) -> None:
    sid, _ = first_leg(gw, 1, {"x-fake-die-after": "4"})
    replay = events(resume(gw, sid, None).text)
    assert "error" in orjson.loads(replay[-1][1].removeprefix("data: "))
    assert all("[DONE]" not in e for _, e in replay)


@pytest.fixture
def keyed(make_gateway: Callable[..., GatewayServer]) -> GatewayServer:
    import hashlib

    def digest(key: str) -> str:
        return hashlib.sha256(key.encode()).hexdigest()

    return make_gateway(KEYS.format(a=digest("key-a"), b=digest("key-b")),
                        policy=RESUME.format(grace=5000))


def test_another_key_gets_the_404_an_unknown_stream_gets(keyed: GatewayServer,
                                                         fake: FakeUpstream) -> None:
    alice, bob = {"authorization": "Bearer key-a"}, {"authorization": "Bearer key-b"}
    sid, _ = first_leg(keyed, 1, alice)
    theirs = resume(keyed, sid, None, headers=bob)
    unknown = resume(keyed, "gws_" + "0" * 32, None, headers=bob)
    assert theirs.status_code == unknown.status_code == 404
    assert theirs.content == unknown.content
    assert theirs.json()["error"]["code"] == "stream_not_found"
    assert "x-gateway-stream-id" not in theirs.headers
    assert resume(keyed, sid, None, headers={}).status_code == 401
    mine = resume(keyed, sid, None, headers=alice)
    assert mine.status_code == 200 and chat_text(mine.text) == TEXT
    # through another API, the same 404, in that API's format
    other = resume(keyed, sid, None, path="/messages", headers=alice)
    assert other.status_code == 404 and other.json()["error"]["type"] == "not_found_error"


def test_another_keys_responses_stream_is_a_404(keyed: GatewayServer,
                                                fake: FakeUpstream) -> None:
    body = {"model": "fake-model", "input": "hi", "stream": True}
    _, read = first_leg(keyed, 2, {"authorization": "Bearer key-a"}, "/responses", body)
    rid = orjson.loads(events(read)[0][1].split("data: ", 1)[1])["response"]["id"]
    url = f"{keyed.v1}/responses/{rid}?stream=true"
    theirs = httpx.get(url, headers={"authorization": "Bearer key-b"}, timeout=10)
    unknown = httpx.get(f"{keyed.v1}/responses/resp_nope?stream=true",
                        headers={"authorization": "Bearer key-b"}, timeout=10)
    assert theirs.status_code == unknown.status_code == 404
    assert theirs.content == unknown.content
    mine = httpx.get(url, headers={"authorization": "Bearer key-a"}, timeout=10)
    assert events(mine.text)[-1][1].startswith("event: response.completed")


def test_a_last_event_id_past_what_was_sent_is_a_400(gw: GatewayServer,
                                                     fake: FakeUpstream) -> None:
    sid, _ = first_leg(gw, 1)
    for bad in ("999", "x"):
        r = httpx.post(gw.v1 + "/chat/completions", json=CHAT, timeout=10, headers={
            "x-gateway-stream-id": sid, "last-event-id": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "Last-Event-ID"


@pytest.fixture
def off(make_gateway: Callable[..., GatewayServer]) -> Iterator[GatewayServer]:
    yield make_gateway()


def test_with_resume_off_streams_are_as_before(off: GatewayServer, fake: FakeUpstream) -> None:
    r = httpx.post(off.v1 + "/chat/completions", json=CHAT, timeout=10)
    assert "x-gateway-stream-id" not in r.headers
    assert all(i is None for i, _ in events(r.text))


def test_streams_past_the_bytes_bound_are_evicted_oldest_first(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream) -> None:
    gw = make_gateway("\n[streams]\nmax_bytes = 5000\n", policy=RESUME.format(grace=5000))
    assert 2000 < len(whole(gw)) < 2500  # (kept too) two streams fit, three do not
    sids = [first_leg(gw, 1)[0] for _ in range(3)]
    fake.wait_for(lambda rs: len(rs) == 4 and all(r.finished for r in rs))
    assert resume(gw, sids[0], None).status_code == 404
    assert all(chat_text(resume(gw, sid, None).text) == TEXT for sid in sids[1:])
