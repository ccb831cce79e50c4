"""bench/streams.py's pure parts: the fault draws, reading a stream, the verdict."""

from __future__ import annotations

import random
from collections import Counter

from bench import streams

CHAT_WHOLE = (b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
              b': keepalive\n\n'
              b'data: {"choices":[{"index":0,"delta":{"content":"w0 "}}]}\n\nid: 3\n\n'
              b'data: {"choices":[{"index":0,"delta":{"content":"w1"}}]}\nid: 4\n\n'
              b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
              b"data: [DONE]\n\n")
MESSAGES_WHOLE = (b'event: message_start\ndata: {"type":"message_start","message":{}}\n\n'
                  b'event: content_block_delta\ndata: {"type":"content_block_delta",'
                  b'"index":0,"delta":{"type":"text_delta","text":"tok0 tok1"}}\n\n'
                  b'event: message_delta\ndata: {"type":"message_delta",'
                  b'"delta":{"stop_reason":"end_turn"}}\n\n'
                  b'event: message_stop\ndata: {"type":"message_stop"}\n\n')


def test_the_draws_are_seeded_and_near_the_issues_shares() -> None:
    draws = [streams.draw(random.Random(7)) for _ in range(3)]
    assert draws == [streams.draw(random.Random(7)) for _ in range(3)]
    rng = random.Random(1)
    counts = Counter(streams.draw(rng)[0] for _ in range(20_000))
    for fault, share in streams.FAULTS:
        assert abs(counts[fault] / 20_000 - share) < share * 0.25, fault
    assert counts[None] > 0.85 * 20_000


def test_a_fault_steers_the_first_attempt_only_through_bench_headers() -> None:
    rng, seen = random.Random(3), set()
    for _ in range(2_000):
        fault, headers = streams.draw(rng)
        assert all(k.startswith("x-fake-bench-") for k in headers)
        if fault == "late":
            assert headers["x-fake-bench-first-token-ms"] == str(19 * streams.TTFT_MS)
        if fault == "stall":
            assert headers["x-fake-bench-stall-ms"] == str(streams.STALL_MS)
            assert streams.mid_stream(headers)
        seen.add(fault)
    assert seen == {None, "late", "stall", "cut", "error"}
    assert not streams.mid_stream({"x-fake-bench-die-after": "0"})  # before the first token
    assert streams.mid_stream({"x-fake-bench-error-midway": "5"})


def test_a_whole_chat_stream_with_ids_and_comments_is_whole() -> None:
    events = streams.parse_sse(CHAT_WHOLE)
    assert streams.text_of("chat", events) == "w0 w1"
    assert streams.verdict("chat", 200, events, "w0 w1") == "whole"
    assert streams.verdict("chat", 200, events, "w0 w1 w2") == "silent"  # text short


def test_an_error_event_without_done_is_explicit_and_a_cut_is_silent() -> None:
    head = CHAT_WHOLE.split(b'data: {"choices":[{"index":0,"delta":{},')[0]
    errored = head + b'data: {"error":{"code":"upstream_stalled"}}\n\n'
    assert streams.verdict("chat", 200, streams.parse_sse(errored), "w0 w1") == "error"
    assert streams.verdict("chat", 200, streams.parse_sse(head), "w0 w1") == "silent"
    both = errored + b"data: [DONE]\n\n"  # an error then a clean end: malformed
    assert streams.verdict("chat", 200, streams.parse_sse(both), "w0 w1") == "silent"
    assert streams.verdict("chat", 504, [], "w0 w1") == "error"
    assert streams.verdict("chat", 200, [(None, '{"choi')], "w0 w1") == "silent"


def test_an_anthropic_stream_needs_one_message_start_and_message_stop() -> None:
    events = streams.parse_sse(MESSAGES_WHOLE)
    assert streams.verdict("messages", 200, events, "tok0 tok1") == "whole"
    twice = streams.parse_sse(MESSAGES_WHOLE.replace(b"event: content_block_delta",
                                                     MESSAGES_WHOLE.split(b"\n\n")[0]
                                                     + b"\n\nevent: content_block_delta"))
    assert streams.verdict("messages", 200, twice, "tok0 tok1") == "silent"
    cut = MESSAGES_WHOLE.split(b"event: message_delta")[0]
    error = cut + b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error"}}\n\n'
    assert streams.verdict("messages", 200, streams.parse_sse(error), "tok0 tok1") == "error"
    assert streams.verdict("messages", 200, streams.parse_sse(cut), "tok0 tok1") == "silent"


def test_p99_and_the_policies() -> None:
    assert streams.p99([]) is None
    assert streams.p99([float(i) for i in range(1, 101)]) == 100.0
    policies = streams.policies()
    assert "max_continuations = 0" in policies["off"]
    assert "stream_idle_timeout_ms = 0" in policies["off"]
    assert 'continue_upstreams = ["vllm-a", "vllm-b"]' in policies["on"]
    assert "[retry_budget]" not in policies["on"]
    assert "[retry_budget]\nratio = 0.2" in streams.policies(0.2)["on"]


def test_the_targets_need_continued_kinds_whole_and_no_silent_truncation() -> None:
    def kind(whole: int, errors: int, silent: int = 0) -> dict[str, object]:
        return {"streams": 10, "whole": whole, "explicit_errors": errors,
                "silent_truncations": silent, "by_fault": {"late": {"whole": 2}}}
    on = {"openai": kind(8, 2), "anthropic": kind(10, 0), "continuable": kind(10, 0)}
    assert streams.targets({"on": on, "off": on})["ok"]
    assert not streams.targets({"on": {**on, "continuable": kind(9, 1)}, "off": on})["ok"]
    assert not streams.targets({"on": on, "off": {**on, "openai": kind(8, 1, 1)}})["ok"]
