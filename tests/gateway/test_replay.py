"""``gateway replay``: MT-Bench-style conversations replayed with the official SDK against the
fake upstream, directly and through a gateway."""

from __future__ import annotations

import uuid
from pathlib import Path

import openai
import orjson

from gateway.tools.replay import load_conversations, replay

ANSWER = "w0 w1 w2 w3 w4 w5 w6 w7"  # the fake's default streamed reply (8 content chunks)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def mt_bench(tmp_path: Path, n: int) -> Path:
    rows = [{"question_id": i, "turns": [f"first question {i}", f"second question {i}"]}
            for i in range(n)]
    return write_jsonl(tmp_path / "mt.jsonl", rows)


def aclient(base_url: str, **kw) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, **kw)


async def test_two_turn_conversations_send_the_first_answer_with_the_second_turn(
    tmp_path, fake_server, fake
):
    convs = load_conversations(mt_bench(tmp_path, 3))
    ticks: list[int] = []
    async with aclient(fake_server.url + "/v1") as c:
        report = await replay(convs, client=c, model="m", concurrency=2, max_tokens=16,
                              progress=ticks.append)
    s = report.summary()
    assert (s["requests"], s["conversations"], s["errors"]) == (6, 3, 0)
    assert s["output_tokens"] == 6 * 8 and sum(ticks) == 6
    assert all(r.ttft_ms is not None and r.tpot_ms is not None for r in report.results)
    assert all(v is not None for k in ("ttft_ms", "tpot_ms", "e2e_ms") for v in s[k].values())
    bodies = [r.json for r in fake.records]
    assert all(b["stream"] and b["stream_options"] == {"include_usage": True} for b in bodies)
    second_turns = [b["messages"] for b in bodies if len(b["messages"]) > 1]
    assert sorted(m[2]["content"] for m in second_turns) == [f"second question {i}"
                                                            for i in range(3)]
    for m in second_turns:  # question, the streamed answer, then the next question
        i = m[0]["content"].rsplit(" ", 1)[1]
        assert m == [{"role": "user", "content": f"first question {i}"},
                     {"role": "assistant", "content": ANSWER},
                     {"role": "user", "content": f"second question {i}"}]


async def test_all_line_shapes_through_a_gateway(tmp_path, gw, fake):
    path = write_jsonl(tmp_path / "mixed.jsonl", [
        {"turns": ["a", "b"]},
        {"prompt": "c"},
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "d"}]},
    ])
    async with aclient(gw.v1) as c:
        report = await replay(load_conversations(path), client=c, model="fake-model",
                              concurrency=8, max_tokens=16)
    s = report.summary()
    assert (s["requests"], s["conversations"], s["errors"], s["output_tokens"]) == (4, 3, 0, 32)
    assert {r.json["model"] for r in fake.records} == {"fake-upstream-model"}
    assert len(load_conversations(path, limit=1)) == 1


async def test_failed_requests_are_counted_and_the_run_goes_on(tmp_path, fake_server, fake):
    # The first request fails (503): its conversation ends there, the other two complete.
    headers = {"x-fake-fail-times": "1", "x-fake-key": uuid.uuid4().hex}
    async with aclient(fake_server.url + "/v1", default_headers=headers) as c:
        ticks: list[int] = []
        report = await replay(load_conversations(mt_bench(tmp_path, 3)), client=c, model="m",
                              concurrency=1, max_tokens=16, progress=ticks.append)
    s = report.summary()
    assert (s["requests"], s["conversations"], s["errors"]) == (5, 3, 1)
    assert s["output_tokens"] == 4 * 8 and sum(ticks) == 6
    assert s["error_types"] == {"InternalServerError": 1}
    [failed] = [r for r in report.results if r.error]
    assert (failed.conversation, failed.turn) == (0, 0)
    assert len(fake.records) == 5

    # A stream that dies half-way is an error too, for every conversation.
    dying = {"x-fake-die-after": "3"}
    async with aclient(fake_server.url + "/v1", default_headers=dying) as c:
        report = await replay(load_conversations(mt_bench(tmp_path, 2)), client=c, model="m",
                              concurrency=2, max_tokens=16)
    s = report.summary()
    assert (s["requests"], s["errors"], s["output_tokens"]) == (2, 2, 0)
    assert s["e2e_ms"]["p50"] is None


async def test_an_agent_trace_replays_one_request_per_recorded_turn_with_its_tools(
    tmp_path, fake_server, fake
):
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_user_details", "arguments": '{"user_id": "u1"}'}}
    trace = [{"role": "system", "content": "policy"}, {"role": "user", "content": "hi"},
             {"role": "assistant", "content": None, "tool_calls": [call]},
             {"role": "tool", "tool_call_id": "call_1", "content": "{}"},
             {"role": "assistant", "content": "Done."}, {"role": "user", "content": "bye"}]
    path = write_jsonl(tmp_path / "trace.jsonl", [{"task_id": 1, "messages": trace}])
    tools = [{"type": "function", "function": {"name": "get_user_details", "parameters": {
        "type": "object", "properties": {"user_id": {"type": "string"}}}}}]
    async with aclient(fake_server.url + "/v1") as c:
        report = await replay(load_conversations(path, per_turn=True), client=c, model="m",
                              concurrency=1, max_tokens=16, tools=tools, recorded=True)
    assert report.summary()["errors"] == 0
    # one request per recorded assistant turn, each with the recorded history before it
    assert [r.json["messages"] for r in fake.records] == [trace[:2], trace[:4]]
    assert all(r.json["tools"] == tools for r in fake.records)
    assert load_conversations(path) == [[trace]]  # without --per-turn: one request
