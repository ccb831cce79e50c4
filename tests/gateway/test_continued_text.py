"""gateway.continued_text: what a continued stream has said, and a continuation's events
rewritten to follow it (pure)."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.continued_text import Transcript
from llm_wire.sse import EventReader, json_event


def chat(delta: dict[str, Any], finish: str | None = None, id_: str = "a",
         usage: dict[str, int] | None = None) -> bytes:
    obj: dict[str, Any] = {"id": id_, "object": "chat.completion.chunk", "choices": [
        {"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage is not None:
        obj = {"id": id_, "choices": [], "usage": usage}
    return json_event(obj)


def events(raw: bytes) -> list[tuple[str | None, Any]]:
    return [(n, orjson.loads(d) if d != b"[DONE]" else d) for n, d in EventReader().feed(raw)]


def test_a_continuation_follows_the_first_attempts_chat_chunks() -> None:
    said = Transcript("openai")
    out, failure = said.taken(chat({"role": "assistant", "content": ""}) + chat(
        {"content": "Hel"}) + chat({"content": "lo "}) + b'data: {"error": {"message": "x"}}\n\n')
    assert failure is not None and b"error" not in out  # the error event is not relayed
    assert said.text == "Hello " and said.blocked is None
    assert said.cut("") == 2
    said.follow()
    out, failure = said.taken(chat({"role": "assistant", "content": ""}, id_="b")
                              + chat({"content": "world"}, id_="b")
                              + chat({}, "stop", id_="b")
                              + chat({}, id_="b", usage={"prompt_tokens": 12,
                                                         "completion_tokens": 1})
                              + b"data: [DONE]\n\n")
    got = events(out)
    assert failure is None and said.ended and said.text == "Hello world"
    assert len(got) == 4  # the role chunk is gone
    assert {e["id"] for _, e in got[:3]} == {"a"}  # the first attempt's id
    assert got[2][1]["usage"] == {"prompt_tokens": 12 + 10, "completion_tokens": 3,
                                  "total_tokens": 25}  # the cut one's: 12 less its 2


def test_a_tool_call_or_reasoning_blocks_a_continuation() -> None:
    said = Transcript("openai")
    said.taken(chat({"content": "x"}) + chat({"tool_calls": [{"index": 0}]}))
    assert said.blocked
    said = Transcript("openai")
    said.taken(chat({"reasoning_content": "hm"}))
    assert said.blocked


def anthropic(name: str, **body: Any) -> bytes:
    return json_event({"type": name, **body}, name)


def test_an_anthropic_continuation_after_a_closed_block_opens_the_next_one() -> None:
    said = Transcript("anthropic")
    said.taken(anthropic("message_start", message={"usage": {"input_tokens": 5}})
               + anthropic("content_block_start", index=0,
                           content_block={"type": "text", "text": ""})
               + anthropic("content_block_delta", index=0,
                           delta={"type": "text_delta", "text": "Hi."})
               + anthropic("content_block_stop", index=0))
    said.cut("")
    said.follow()
    out, _ = said.taken(anthropic("message_start", message={"usage": {"input_tokens": 9}})
                        + anthropic("content_block_start", index=0,
                                    content_block={"type": "text", "text": ""})
                        + anthropic("content_block_delta", index=0,
                                    delta={"type": "text_delta", "text": " Bye"})
                        + anthropic("content_block_stop", index=0)
                        + anthropic("message_delta", delta={"stop_reason": "end_turn"},
                                    usage={"output_tokens": 1})
                        + anthropic("message_stop"))
    got = events(out)
    assert [n for n, _ in got] == ["content_block_start", "content_block_delta",
                                   "content_block_stop", "message_delta", "message_stop"]
    assert [e["index"] for _, e in got[:3]] == [1, 1, 1]
    assert got[3][1]["usage"] == {"output_tokens": 2, "input_tokens": 14}
    assert said.text == "Hi. Bye" and said.ended


def test_whitespace_held_back_from_a_prefill_is_dropped_once_repeated() -> None:
    said = Transcript("anthropic")
    said.taken(anthropic("content_block_start", index=0,
                         content_block={"type": "text", "text": ""})
               + anthropic("content_block_delta", index=0,
                           delta={"type": "text_delta", "text": "Hi \n"}))
    said.cut(" \n")
    said.follow()
    out, _ = said.taken(anthropic("content_block_start", index=0,
                                  content_block={"type": "text", "text": ""})
                        + anthropic("content_block_delta", index=0,
                                    delta={"type": "text_delta", "text": " "})
                        + anthropic("content_block_delta", index=0,
                                    delta={"type": "text_delta", "text": "\nthere"}))
    assert said.text == "Hi \nthere"
    assert [e["index"] for _, e in events(out)] == [0, 0]  # its own start: dropped
