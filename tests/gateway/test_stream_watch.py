"""Issue 48, items 1 and 2, as clients see them over real HTTP: a stream whose first token
is late goes to the model's next target before anything of it reached the client (one
role chunk, one ``message_start``, one ``response.created``), and a stream that stalls once
answering ends with the client's own error event, never a clean end. The fakes are steered
per upstream by its config's ``headers`` (gateway.testing.fake_stalls)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from gateway.testing.fake_anthropic import FakeAnthropic
from gateway.testing.fake_upstream import FakeUpstream
from tests.conftest import DEFAULT_POLICY, GatewayServer
from tests.gateway.conftest import ANTHROPIC_KEY_ENV

CHAT = {"model": "watched", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
WORDS = "w0 w1 w2 w3 w4 w5 w6 w7"


def upstreams(fake_url: str, slow: str, kind: str = "openai", extra: str = "") -> str:
    """Two upstreams on the fakes: ``slow`` (steered by ``slow``'s headers) first, then
    ``quick``; the model ``watched`` has both as targets."""
    base = f"{fake_url}/slow/v1" if kind == "openai" else fake_url
    quick = f"{fake_url}/quick/v1" if kind == "openai" else fake_url
    key = "" if kind == "openai" else f'api_key_env = "{ANTHROPIC_KEY_ENV}"'
    return f"""
[upstreams.slow]
type = "{kind}"
base_url = "{base}"
forward_headers = ["x-fake-*"]
headers = {{ {slow} }}
{key}
{extra}

[upstreams.quick]
type = "{kind}"
base_url = "{quick}"
forward_headers = ["x-fake-*"]
{key}
{extra}

[models.watched]
targets = [{{ upstream = "slow", model = "m" }}, {{ upstream = "quick", model = "m" }}]
"""


def policy(watch: str, retry: str = "max_attempts = 3") -> str:
    return DEFAULT_POLICY.replace("max_attempts = 3", retry) + f"\n[stream_watch]\n{watch}\n"


def sse(url: str, body: dict[str, Any], headers: dict[str, str] | None = None
        ) -> list[tuple[str | None, str]]:
    """The client's stream as (event name, data) pairs; comments as (":", text)."""
    out: list[tuple[str | None, str]] = []
    name: str | None = None
    with httpx.Client(timeout=10) as c, c.stream("POST", url, json=body,
                                                 headers=headers or {}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith(":"):
                out.append((":", line))
            elif line.startswith("event:"):
                name = line.removeprefix("event:").strip()
            elif line.startswith("data:"):
                out.append((name, line.removeprefix("data:").strip()))
                name = None
    return out


def chat_text(events: list[tuple[str | None, str]]) -> str:
    text = ""
    for name, data in events:
        if name is None and data != "[DONE]":
            for choice in orjson.loads(data).get("choices", []):
                text += choice["delta"].get("content") or ""
    return text


def metric(gw: GatewayServer, line: str) -> float:
    body = httpx.get(gw.url + "/metrics").text
    found = [row for row in body.splitlines() if row.startswith(line + " ")]
    assert found, f"{line} not in /metrics"
    return float(found[0].rsplit(" ", 1)[1])


# -- the first-token deadline ------------------------------------------------------------

@pytest.fixture
def late(make_gateway: Callable[..., GatewayServer], fake_server: Any) -> GatewayServer:
    """``slow`` sends its role chunk at once, then pings, and its first token after 5 s."""
    return make_gateway(upstreams(
        fake_server.url, '"x-fake-first-token-ms" = "5000", "x-fake-ping-ms" = "20"'),
        policy=policy("first_token_ms = 150") + "\n[streaming]\nkeepalive_s = 0.03\n")


def test_a_late_first_token_fails_over_and_the_client_reads_one_answer(
        late: GatewayServer, fake: FakeUpstream) -> None:
    events = sse(late.v1 + "/chat/completions", CHAT)
    assert events[0][0] == ":"  # the gateway's keepalive comments went out meanwhile...
    data = [d for n, d in events if n is None]
    roles = [d for d in data if '"role"' in d]
    assert len(roles) == 1 and data[-1] == "[DONE]"  # ...and the stream is one answer
    assert chat_text(events) == WORDS
    log = late.logged()[0]
    assert log["upstream"] == "quick" and log["first_token_timeouts"] == 1
    assert log["retries"] == 1 and log["status"] == 200 and log["stalled"] is None
    slow = fake.wait_for(lambda rs: [r for r in rs if r.path.startswith("/slow")
                                     and r.disconnected])[0]
    assert slow.chunks_sent == 0  # cancelled before it answered
    assert metric(late, 'gateway_first_token_timeouts_total{upstream="slow"}') == 1
    assert metric(late, 'gateway_first_token_timeouts_total{upstream="quick"}') == 0


def test_the_openai_sdk_reads_the_failed_over_stream(late: GatewayServer,
                                                     fake: FakeUpstream) -> None:
    with openai.OpenAI(base_url=late.v1, api_key="k", max_retries=0) as client:
        stream = client.chat.completions.create(**CHAT)  # type: ignore[call-overload]
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == WORDS


def test_a_stream_that_breaks_before_its_first_token_fails_over_too(
        make_gateway: Callable[..., GatewayServer], fake_server: Any,
        fake: FakeUpstream) -> None:
    gw = make_gateway(upstreams(fake_server.url, '"x-fake-die-after" = "0"'),
                      policy=policy("", "max_attempts = 1"))
    assert chat_text(sse(gw.v1 + "/chat/completions", CHAT)) == WORDS  # not an error event
    assert gw.logged()[0]["upstream"] == "quick"


def test_an_error_event_before_the_first_token_fails_over(
        make_gateway: Callable[..., GatewayServer], fake_server: Any,
        fake: FakeUpstream) -> None:
    """An upstream that opens its stream, then sends an in-band server error before any
    answer (overloaded): retried as a failure before the first byte, the client reads the
    other target's answer whole, one role chunk and no error."""
    gw = make_gateway(upstreams(fake_server.url, '"x-fake-error-midway" = "0"'),
                      policy=policy("", "max_attempts = 1"))
    events = sse(gw.v1 + "/chat/completions", CHAT)
    data = [d for n, d in events if n is None]
    assert chat_text(events) == WORDS and data[-1] == "[DONE]"
    assert len([d for d in data if '"role"' in d]) == 1 and not any('"error"' in d for d in data)
    log = gw.logged()[0]
    assert (log["upstream"], log["retries"], log["error_type"]) == ("quick", 1, None)


def test_the_last_attempts_error_event_reaches_the_client_with_the_upstreams_type(
        make_gateway: Callable[..., GatewayServer], fake_server: Any,
        fake: FakeUpstream) -> None:
    """Where nothing could follow, the in-band error is relayed as the upstream sent it."""
    gw = make_gateway(upstreams(fake_server.url, '"x-fake-error-midway" = "0"').replace(
        '{ upstream = "quick", model = "m" }', ""), policy=policy("", "max_attempts = 1"))
    data = [d for n, d in sse(gw.v1 + "/chat/completions", CHAT) if n is None]
    assert orjson.loads(data[-1])["error"]["type"] == "server_error"
    assert gw.logged()[0]["error_type"] == "server_error"


def test_an_anthropic_error_event_before_the_first_token_fails_over(
        make_gateway: Callable[..., GatewayServer],
        claude_upstream: tuple[FakeAnthropic, str]) -> None:
    url = claude_upstream[1]
    gw = make_gateway(upstreams(url, '"x-fake-error-midway" = "0"', "anthropic"),
                      policy=policy("", "max_attempts = 1"))
    with anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0) as client, \
            client.messages.stream(model="watched", max_tokens=50,
                                   messages=[{"role": "user", "content": "hi"}]) as stream:
        assert stream.get_final_text() == "tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7"
    assert gw.logged()[0]["retries"] == 1


def test_a_first_token_within_the_deadline_is_not_cut(
        make_gateway: Callable[..., GatewayServer], fake_server: Any,
        fake: FakeUpstream) -> None:
    gw = make_gateway(upstreams(fake_server.url, '"x-fake-first-token-ms" = "50", '
                                '"x-fake-ping-ms" = "10"'), policy=policy("first_token_ms = 2000"))
    assert chat_text(sse(gw.v1 + "/chat/completions", CHAT)) == WORDS
    log = gw.logged()[0]
    assert log["upstream"] == "slow" and log["first_token_timeouts"] == 0
    assert log["ttft_ms"] >= 50  # the time to the first token, not to the role chunk


def test_the_last_attempt_has_no_deadline(make_gateway: Callable[..., GatewayServer],
                                          fake_server: Any, fake: FakeUpstream) -> None:
    """One target, two tries: the first is cut, the second waits for its late token (a
    slow answer is never turned into an error)."""
    gw = make_gateway(upstreams(fake_server.url, '"x-fake-first-token-ms" = "300"').replace(
        '{ upstream = "quick", model = "m" }', ""), policy=policy(
        "first_token_ms = 100", "max_attempts = 2"))
    assert chat_text(sse(gw.v1 + "/chat/completions", CHAT)) == WORDS
    log = gw.logged()[0]
    assert log["first_token_timeouts"] == 1 and log["retries"] == 1 and log["status"] == 200


def test_the_learned_deadline_cuts_an_attempt_far_past_the_targets_usual_first_token(
        make_gateway: Callable[..., GatewayServer], fake_server: Any,
        fake: FakeUpstream) -> None:
    gw = make_gateway(upstreams(fake_server.url, ""), policy=policy(
        "first_token_min_samples = 3\nfirst_token_floor_ms = 100\nfirst_token_factor = 1"))
    for _ in range(3):  # the slow upstream answers at once: three samples of a few ms
        assert chat_text(sse(gw.v1 + "/chat/completions", CHAT)) == WORDS
    assert chat_text(sse(gw.v1 + "/chat/completions", CHAT,
                         {"x-fake-first-token-ms": "800"})) == WORDS  # both slow now:
    log = gw.logged(4)[3]
    # the first cut at the floor, the second (the last attempt) waited for its token
    assert log["first_token_timeouts"] == 1 and log["upstream"] == "quick"


def test_a_target_whose_cuts_do_not_pay_is_not_cut_any_more(
        make_gateway: Callable[..., GatewayServer], fake_server: Any,
        fake: FakeUpstream) -> None:
    """When the attempt after each cut is as slow (the request's own slowness, as a
    reasoning model's), four cuts of eight not paying turn the target's learned deadline
    off: the next slow request is waited for, not cut again."""
    gw = make_gateway(upstreams(fake_server.url, ""), policy=policy(
        "first_token_min_samples = 3\nfirst_token_floor_ms = 100\nfirst_token_factor = 1\n"
        "first_token_percentile = 0.5"))
    for _ in range(3):
        assert chat_text(sse(gw.v1 + "/chat/completions", CHAT)) == WORDS
    slow = {"x-fake-first-token-ms": "300"}  # every attempt of these requests is slow
    for _ in range(5):
        assert chat_text(sse(gw.v1 + "/chat/completions", CHAT, slow)) == WORDS
    cuts = [line["first_token_timeouts"] for line in gw.logged(8)[3:]]
    assert cuts == [1, 1, 1, 1, 0]
    assert gw.logged(8)[7]["upstream"] == "slow"


def test_an_anthropic_client_gets_one_message_start_after_a_failover(
        make_gateway: Callable[..., GatewayServer],
        claude_upstream: tuple[FakeAnthropic, str]) -> None:
    url = claude_upstream[1]
    gw = make_gateway(upstreams(url, '"x-fake-first-token-ms" = "5000", "x-fake-ping-ms" = '
                                '"20"', "anthropic"), policy=policy("first_token_ms = 150"))
    body = {"model": "watched", "max_tokens": 50, "stream": True,
            "messages": [{"role": "user", "content": "hi"}]}
    events = sse(gw.url + "/v1/messages", body, {"anthropic-version": "2023-06-01"})
    names = [n for n, _ in events]
    assert names.count("message_start") == 1 and names[-1] == "message_stop"
    assert names.count("ping") == 1  # the quick one's own; the slow one's pings: gone
    with anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0) as client, \
            client.messages.stream(model="watched", max_tokens=50,
                                   messages=[{"role": "user", "content": "hi"}]) as stream:
        assert stream.get_final_text() == "tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7"
    assert [r["first_token_timeouts"] for r in gw.logged(2)] == [1, 1]


def test_a_responses_client_gets_one_response_created_after_a_failover(
        make_gateway: Callable[..., GatewayServer], fake_server: Any,
        fake: FakeUpstream) -> None:
    gw = make_gateway(upstreams(fake_server.url, '"x-fake-first-token-ms" = "5000"',
                                extra="native_responses = true"),
                      policy=policy("first_token_ms = 150"))
    events = sse(gw.v1 + "/responses", {"model": "watched", "input": "hi", "stream": True})
    names = [n for n, _ in events]
    assert names.count("response.created") == 1 and names[-1] == "response.completed"
    with openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0) as client, \
            client.responses.stream(model="watched", input="hi") as stream:
        assert stream.get_final_response().output_text == WORDS
    assert gw.logged(2)[0]["upstream"] == "quick"


# -- stalls ----------------------------------------------------------------------------

STALL = '"x-fake-stall-after" = "2", "x-fake-ping-ms" = "20"'  # pings all through the stall


def stalled(make_gateway: Callable[..., GatewayServer], url: str, kind: str = "openai",
            watch: str = "stream_idle_timeout_ms = 150", extra: str = "") -> GatewayServer:
    return make_gateway(upstreams(url, STALL, kind, extra), policy=policy(watch))


def test_a_chat_stream_that_stalls_ends_with_an_error_event_not_done(
        make_gateway: Callable[..., GatewayServer], fake_server: Any,
        fake: FakeUpstream) -> None:
    gw = stalled(make_gateway, fake_server.url)
    events = sse(gw.v1 + "/chat/completions", CHAT)
    assert chat_text(events[:-1]) == "w0 w1 "  # what it had, then...
    error = orjson.loads(events[-1][1])["error"]
    assert error["code"] == "upstream_stalled" and "[DONE]" not in {d for _, d in events}
    log = gw.logged()[0]
    assert log["stalled"] == "idle" and log["error_code"] == "upstream_stalled"
    assert log["upstream"] == "slow"  # content had reached the client: no failover
    fake.wait_for(lambda rs: [r for r in rs if r.disconnected])  # the upstream was closed
    assert metric(gw, 'gateway_stream_stalls_total{reason="idle",upstream="slow"}') == 1
    with openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0) as client, \
            pytest.raises(openai.APIError, match="stalled"):
        for _ in client.chat.completions.create(**CHAT):  # type: ignore[call-overload]
            pass


def test_an_anthropic_stream_that_stalls_ends_with_an_error_event(
        make_gateway: Callable[..., GatewayServer],
        claude_upstream: tuple[FakeAnthropic, str]) -> None:
    url = claude_upstream[1]
    gw = stalled(make_gateway, url, "anthropic")
    body = {"model": "watched", "max_tokens": 50, "stream": True,
            "messages": [{"role": "user", "content": "hi"}]}
    events = sse(gw.url + "/v1/messages", body, {"anthropic-version": "2023-06-01"})
    names = [n for n, _ in events]
    assert names.count("content_block_delta") == 2 and names[-1] == "error"
    assert "message_stop" not in names
    assert orjson.loads(events[-1][1])["error"]["type"] == "timeout_error"
    assert gw.logged()[0]["stalled"] == "idle"


@pytest.mark.parametrize("native", [True, False], ids=["native", "translated"])
def test_a_responses_stream_that_stalls_ends_with_response_failed(
        make_gateway: Callable[..., GatewayServer], fake_server: Any,
        fake: FakeUpstream, native: bool) -> None:
    """The Responses API's own end of a failed response: ``response.failed``, the response
    the client saw created, failed, with the error; never ``response.completed``."""
    gw = stalled(make_gateway, fake_server.url,
                 extra="native_responses = true" if native else "")
    events = sse(gw.v1 + "/responses", {"model": "watched", "input": "hi", "stream": True})
    names = [n for n, _ in events]
    assert names.count("response.output_text.delta") == 2 and names[-1] == "response.failed"
    assert "response.completed" not in names
    created = orjson.loads(events[names.index("response.created")][1])["response"]
    failed = orjson.loads(events[-1][1])
    assert failed["sequence_number"] == len([n for n in names if n != ":"]) - 1
    assert failed["response"]["id"] == created["id"]
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["error"]["code"] == "server_error"
    assert "stalled" in failed["response"]["error"]["message"]
    assert gw.logged()[0]["error_code"] == "upstream_stalled"


def test_the_openai_sdk_reads_a_failed_responses_stream(
        make_gateway: Callable[..., GatewayServer], fake_server: Any,
        fake: FakeUpstream) -> None:
    gw = stalled(make_gateway, fake_server.url, extra="native_responses = true")
    with openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0) as client:
        stream = client.responses.create(model="watched", input="hi", stream=True)
        kinds = [event.type for event in stream]
    assert kinds[-1] == "response.failed" and "response.completed" not in kinds


def test_a_pause_shorter_than_the_idle_timeout_is_no_stall(
        make_gateway: Callable[..., GatewayServer], fake_server: Any,
        fake: FakeUpstream) -> None:
    gw = make_gateway(upstreams(fake_server.url, '"x-fake-stall-after" = "2", '
                                '"x-fake-stall-ms" = "60"'),
                      policy=policy("stream_idle_timeout_ms = 1000"))
    assert chat_text(sse(gw.v1 + "/chat/completions", CHAT)) == WORDS
    assert gw.logged()[0]["stalled"] is None


def test_a_stream_under_the_minimum_pace_is_a_stall(
        make_gateway: Callable[..., GatewayServer], fake_server: Any,
        fake: FakeUpstream) -> None:
    gw = make_gateway(upstreams(fake_server.url, '"x-fake-itl-ms" = "60", '
                                '"x-fake-tokens" = "40"'),
                      policy=policy("min_tokens_per_s = 50\npace_window_s = 0.2"))
    events = sse(gw.v1 + "/chat/completions", CHAT)
    assert orjson.loads(events[-1][1])["error"]["code"] == "upstream_stalled"
    assert gw.logged()[0]["stalled"] == "slow"


# -- nothing to watch ----------------------------------------------------------------------

QUIET = ("first_token_factor = 0\nstream_idle_timeout_ms = 0\nmax_continuations = 0")


def test_with_every_watch_off_the_opening_goes_out_before_the_first_token(
        make_gateway: Callable[..., GatewayServer], fake_server: Any,
        fake: FakeUpstream) -> None:
    """Nothing is read ahead to the first token: the role chunk reaches the client while
    the upstream still thinks, and a late first token is waited for, as before the watch."""
    gw = make_gateway(upstreams(fake_server.url, '"x-fake-first-token-ms" = "1500"'),
                      policy=policy(QUIET))
    with httpx.Client(timeout=10) as c, c.stream("POST", gw.v1 + "/chat/completions",
                                                 json=CHAT) as r:
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data:"))
        assert '"role"' in first  # the opening chunk, before the first token exists
        assert not fake.wait_for(lambda rs: rs)[0].chunks_sent > 1
        rest = "\n".join([first, *lines])
    assert "w0 w1" in "".join(orjson.loads(line[5:])["choices"][0]["delta"].get("content")
                              or "" for line in rest.splitlines()
                              if line.startswith("data:") and "[DONE]" not in line)
    log = gw.logged()[0]
    assert log["upstream"] == "slow" and log["first_token_timeouts"] == 0
