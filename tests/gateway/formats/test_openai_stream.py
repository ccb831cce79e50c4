"""StreamObserver: whole events out, facts noted, nothing re-serialised."""

from __future__ import annotations

import orjson

from gateway.errors import GatewayError
from gateway.formats.openai import error_event
from gateway.formats.openai_stream import StreamObserver


def ev(obj) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


CHUNK = ev({"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]})
FINAL = ev({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
USAGE = ev({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2,
                                     "prompt_tokens_details": {"cached_tokens": 1}}})
DONE = b"data: [DONE]\n\n"


def test_partial_events_are_held_until_complete():
    obs = StreamObserver()
    assert obs.feed(CHUNK[:10]) == b""
    assert obs.feed(CHUNK[10:] + FINAL[:5]) == CHUNK
    assert obs.feed(FINAL[5:]) == FINAL
    assert obs.finish_reason == "length"


def test_bytes_pass_through_unchanged():
    stream = CHUNK + FINAL + USAGE + DONE
    obs = StreamObserver()
    out = b"".join(obs.feed(stream[i:i + 7]) for i in range(0, len(stream), 7)) + obs.flush()
    assert out == stream
    assert obs.done and obs.usage["completion_tokens"] == 2


def test_usage_chunk_hidden_when_the_gateway_asked_for_it():
    obs = StreamObserver(hide_usage_chunk=True)
    out = obs.feed(CHUNK + FINAL + USAGE + DONE)
    assert out == CHUNK + FINAL + DONE
    assert obs.usage == {"prompt_tokens": 3, "completion_tokens": 2,
                         "prompt_tokens_details": {"cached_tokens": 1}}


def test_crlf_framing_is_understood():
    obs = StreamObserver()
    out = obs.feed(CHUNK.replace(b"\n", b"\r\n") + DONE.replace(b"\n", b"\r\n"))
    assert out == CHUNK + DONE and obs.done


def test_error_events_are_noticed():
    obs = StreamObserver()
    obs.feed(error_event(GatewayError("boom")))
    assert obs.errored and not obs.done


def test_unterminated_last_event_is_flushed_with_its_terminator():
    obs = StreamObserver()
    assert obs.feed(b"data: [DONE]") == b""
    assert obs.flush() == DONE and obs.done


def test_a_whole_stream_in_one_block_is_read_from_its_end():
    # A fast upstream's whole answer arrives at once: the facts sit at its end.
    obs = StreamObserver(hide_usage_chunk=True)
    out = obs.feed(CHUNK * 30 + FINAL + USAGE + DONE)
    assert out == CHUNK * 30 + FINAL + DONE
    assert obs.done and obs.finish_reason == "length" and obs.usage["prompt_tokens"] == 3


def test_running_usage_in_every_chunk_keeps_the_last_totals():
    # vLLM's continuous_usage_stats: a usage object in every chunk, running totals.
    def chunk(n: int) -> bytes:
        return ev({"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": None}],
                   "usage": {"prompt_tokens": 3, "completion_tokens": n}})
    obs = StreamObserver()
    stream = chunk(1) + chunk(2) + chunk(3) + DONE
    assert obs.feed(stream) == stream
    assert obs.usage == {"prompt_tokens": 3, "completion_tokens": 3}


def test_an_error_before_the_end_of_a_block_is_noticed():
    obs = StreamObserver()
    obs.feed(CHUNK + error_event(GatewayError("boom")) + DONE)
    assert obs.errored and obs.done
