"""The provider prompt-cache simulators (gateway.testing.cache_sim), table-driven, and the fakes
reporting their usage through the official SDKs (``simulate_cache=True``).

Most tables count tokens as whitespace-separated words (crc32 ids), so lengths are exact."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from gateway.testing.cache_sim import (
    AnthropicCache,
    CacheSims,
    OpenAICache,
    Tokenizer,
    common_tokens,
    openai_prompt,
)
from gateway.testing.fake_anthropic import FakeAnthropic
from gateway.testing.fake_upstream import FakeUpstream
from gateway.testing.server import ServerThread


def words(text: str) -> list[int]:
    return [zlib.crc32(w.encode()) for w in text.split()]


def text(n: int, tag: str = "w") -> str:
    """``n`` distinct words (tokens)."""
    return " ".join(f"{tag}{i}" for i in range(n))


MARK = {"type": "ephemeral"}


def anthropic_sim() -> AnthropicCache:
    return AnthropicCache(Tokenizer(words), clock=lambda: 0.0)


def messages_body(model: str, system: str, turns: list[str], marks: tuple[int, ...] = (),
                  system_mark: Any = MARK) -> dict[str, Any]:
    """A Messages body: ``system`` as one block (marked with ``system_mark``), then one
    one-block message per turn (user/assistant alternating), marked where ``marks`` say."""
    msgs = []
    for i, turn in enumerate(turns):
        block: dict[str, Any] = {"type": "text", "text": turn}
        if i in marks:
            block["cache_control"] = MARK
        msgs.append({"role": "user" if i % 2 == 0 else "assistant", "content": [block]})
    sys_block: dict[str, Any] = {"type": "text", "text": system}
    if system_mark is not None:
        sys_block["cache_control"] = system_mark
    return {"model": model, "max_tokens": 8, "system": [sys_block], "messages": msgs}


# -- Anthropic -------------------------------------------------------------------------------

@pytest.mark.parametrize(("model", "prefix", "cached"), [
    ("claude-sonnet-4-5", 1024, True),
    ("claude-sonnet-4-5", 1023, False),
    ("claude-3-5-haiku-20241022", 2047, False),
    ("claude-3-5-haiku-20241022", 2048, True),
    ("claude-haiku-4-5", 4095, False),
    ("claude-opus-4-5-20251101", 4096, True),
    ("claude-sonnet-4-6", 2047, False),
])
def test_anthropic_caches_only_prefixes_of_the_models_minimum_length(
        model: str, prefix: int, cached: bool) -> None:
    sim = anthropic_sim()
    body = messages_body(model, text(prefix), ["hi there"])
    first, second = sim.usage(body), sim.usage(body)
    assert first["cache_creation_input_tokens"] == (prefix if cached else 0)
    assert first["cache_read_input_tokens"] == 0
    assert second["cache_read_input_tokens"] == (prefix if cached else 0)
    assert second["cache_creation_input_tokens"] == 0
    assert second["input_tokens"] == (2 if cached else prefix + 2)


@pytest.mark.parametrize(("grown", "read"), [
    (0, "tail"), (1, "tail"), (20, "tail"),  # the old tail is within the 20-block lookback
    (21, "system"),  # beyond it: only the system breakpoint is found again
])
def test_anthropic_looks_back_20_blocks_from_a_breakpoint(grown: int, read: str) -> None:
    sim = anthropic_sim()
    turns = [f"turn{i} x" for i in range(3)]
    sim.usage(messages_body("claude-sonnet-4-5", text(2000), turns, marks=(2,)))
    longer = turns + [f"more{i}" for i in range(grown)]
    usage = sim.usage(messages_body("claude-sonnet-4-5", text(2000), longer,
                                    marks=(len(longer) - 1,)))
    assert usage["cache_read_input_tokens"] == {"tail": 2006, "system": 2000}[read]
    assert usage["cache_creation_input_tokens"] == 2006 + grown - usage["cache_read_input_tokens"]
    assert usage["input_tokens"] == 0  # everything sits before the last breakpoint


@pytest.mark.parametrize(("ttl", "gap", "hit"), [
    (None, 299.0, True), (None, 300.0, False),
    ("5m", 299.0, True), ("5m", 300.0, False),
    ("1h", 3599.0, True), ("1h", 3600.0, False),
])
def test_anthropic_entries_expire_after_their_ttl(ttl: str | None, gap: float,
                                                  hit: bool) -> None:
    sim = anthropic_sim()
    mark = {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}
    body = messages_body("claude-sonnet-4-5", text(1500), ["hello"], system_mark=mark)
    first = sim.usage(body, now=1000.0)
    assert first["cache_creation"] == {
        "ephemeral_5m_input_tokens": 0 if ttl == "1h" else 1500,
        "ephemeral_1h_input_tokens": 1500 if ttl == "1h" else 0}
    assert sim.usage(body, now=1000.0 + gap)["cache_read_input_tokens"] == (1500 if hit else 0)


def test_anthropic_reads_refresh_the_ttl() -> None:
    sim = anthropic_sim()
    body = messages_body("claude-sonnet-4-5", text(1500), ["hello"])
    sim.usage(body, now=0.0)
    reads = [sim.usage(body, now=t)["cache_read_input_tokens"] for t in (250, 500, 750, 1100)]
    assert reads == [1500, 1500, 1500, 0]  # each read keeps it 5 more minutes; then a gap


@pytest.mark.parametrize(("marks", "ok"), [(2, True), (3, True), (4, False)])
def test_anthropic_allows_at_most_4_breakpoints(marks: int, ok: bool) -> None:
    # the system's marker plus ``marks`` on messages
    body = messages_body("claude-sonnet-4-5", text(1500), [f"t{i}" for i in range(5)],
                         marks=tuple(range(marks)))
    if ok:
        anthropic_sim().usage(body)
    else:
        with pytest.raises(ValueError, match="A maximum of 4 blocks with cache_control"):
            anthropic_sim().usage(body)


def test_anthropic_segments_are_charged_at_their_breakpoints_ttl() -> None:
    sim = anthropic_sim()
    body = messages_body("claude-sonnet-4-5", text(1500), ["a b c", "d e", "f g h i"],
                         marks=(1,), system_mark={"type": "ephemeral", "ttl": "1h"})
    usage = sim.usage(body)
    assert usage["cache_creation"] == {"ephemeral_1h_input_tokens": 1500,
                                       "ephemeral_5m_input_tokens": 5}
    assert (usage["cache_creation_input_tokens"], usage["input_tokens"]) == (1505, 4)


def test_anthropic_top_level_cache_control_marks_the_last_block() -> None:
    sim = anthropic_sim()
    body = messages_body("claude-sonnet-4-5", text(1500), ["one two", "three"],
                         system_mark=None)
    assert sim.usage(body)["cache_creation_input_tokens"] == 0  # no breakpoint at all
    body["cache_control"] = MARK
    assert sim.usage(body)["cache_creation_input_tokens"] == 1503
    body["messages"].append({"role": "user", "content": "four five"})
    assert sim.usage(body)["cache_read_input_tokens"] == 1503


@pytest.mark.parametrize(("change", "read"), [
    ("nothing", 1701),
    ("move the marker to a later block", 1701),  # markers are not content; found looking back
    ("body keys in another order", 1701),  # the cache order is tools, system, messages
    ("tool schema keys in another order", 0),
    ("tool_choice", 0),
    ("a word of the system prompt", 0),
])
def test_anthropic_prefix_is_the_canonical_content(change: str, read: int) -> None:
    sim = anthropic_sim()
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    tool = {"name": "weather", "description": text(200, "d"), "input_schema": schema}
    body = messages_body("claude-sonnet-4-5", text(1500), ["hi", "hello", "bye"], marks=(0,))
    body["system"][0].pop("cache_control")
    body["tools"] = [tool]
    # the tool (its JSON: 200 words), the system prompt (1500), "hi" (1): written
    assert sim.usage(body)["cache_creation_input_tokens"] == 1701
    again = {**body, "messages": [dict(m) for m in body["messages"]]}
    if change == "move the marker to a later block":
        again["messages"][0] = {"role": "user", "content": "hi"}
        again["messages"][2] = {"role": "user", "content": [
            {"type": "text", "text": "bye", "cache_control": MARK}]}
    elif change == "body keys in another order":
        again = {"messages": body["messages"], "system": body["system"], "tools": body["tools"],
                 "model": body["model"], "max_tokens": 8}
    elif change == "tool schema keys in another order":
        again["tools"] = [{"input_schema": schema, "name": "weather",
                           "description": text(200, "d")}]
    elif change == "tool_choice":
        again["tool_choice"] = {"type": "any"}
    elif change == "a word of the system prompt":
        again["system"] = [{"type": "text", "text": "changed " + text(1499)}]
    assert sim.usage(again)["cache_read_input_tokens"] == read


# -- OpenAI ----------------------------------------------------------------------------------

def openai_sim(**options: Any) -> OpenAICache:
    return OpenAICache(Tokenizer(words), clock=lambda: 0.0, **options)


def chat(n: int, tag: str = "w", **extra: Any) -> dict[str, Any]:
    """A chat body whose prompt is ``n`` tokens (the role marker is one)."""
    return {"model": "gpt-4o", "messages": [{"role": "user", "content": text(n - 1, tag)}],
            **extra}


@pytest.mark.parametrize(("tokens", "cached"), [
    (1023, 0), (1024, 1024), (1151, 1024), (1152, 1152), (2000, 1920), (4096, 4096),
])
def test_openai_caches_from_1024_tokens_in_128_token_steps(tokens: int, cached: int) -> None:
    sim = openai_sim()
    assert sim.usage(chat(tokens)).cached_tokens == 0
    usage = sim.usage(chat(tokens))
    assert (usage.prompt_tokens, usage.cached_tokens) == (tokens, cached)


@pytest.mark.parametrize(("shared", "cached"), [(1000, 0), (1100, 1024), (1500, 1408),
                                                (2999, 2944)])
def test_openai_reads_the_longest_prefix_seen(shared: int, cached: int) -> None:
    sim = openai_sim(machines=1)
    sim.usage(chat(3000))
    other = text(shared - 1) + " " + text(3000 - shared, "x")
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": other}]}
    assert sim.usage(body).cached_tokens == cached


def test_openai_routing_by_prefix_and_prompt_cache_key() -> None:
    sim = openai_sim(machines=8)
    prompt = openai_prompt(chat(2000), sim.tokenizer)
    home = sim.machine_of(prompt, None)
    away = next(f"k{i}" for i in range(100) if sim.machine_of(prompt, f"k{i}") != home)
    same = next(f"k{i}" for i in range(100) if sim.machine_of(prompt, f"k{i}") == home)
    cases = [  # (first request's key, second's, cached)
        (None, None, 1920), ("a", "a", 1920), (None, away, 0), (None, same, 1920)]
    for first, second, cached in cases:
        fresh = openai_sim(machines=8)
        fresh.usage(chat(2000, prompt_cache_key=first) if first else chat(2000))
        usage = fresh.usage(chat(2000, prompt_cache_key=second) if second else chat(2000))
        assert usage.cached_tokens == cached, (first, second)
    # the route depends on the first 256 tokens only
    tail = openai_prompt(chat(2000), sim.tokenizer)[:256 * 4] + b"\1\0\0\0" * 10
    assert sim.machine_of(tail, None) == home


def test_openai_tool_order_is_part_of_the_prefix() -> None:
    tools = [{"type": "function", "function": {"name": f"f{i}", "description": text(300, f"t{i}")}}
             for i in range(4)]
    sim = openai_sim(machines=1)
    sim.usage(chat(500, tools=tools))
    assert sim.usage(chat(500, tools=tools)).cached_tokens > 1024
    assert sim.usage(chat(500, tools=tools[::-1])).cached_tokens == 0


@pytest.mark.parametrize(("gap", "retention", "hit"), [
    (299.0, None, True), (300.0, None, False), (3600.0, "24h", True), (86_400.0, "24h", False)])
def test_openai_entries_expire_when_idle(gap: float, retention: str | None, hit: bool) -> None:
    sim = openai_sim(ttl_s=300.0)
    extra = {"prompt_cache_retention": retention} if retention else {}
    sim.usage(chat(1500, **extra), now=0.0)
    assert sim.usage(chat(1500, **extra), now=gap).cached_tokens == (1408 if hit else 0)


def test_openai_machines_forget_the_least_recently_used() -> None:
    sim = openai_sim(machines=1, capacity=4)  # boundaries 1024..1408 of one prompt fill it
    sim.usage(chat(1500, "a"))
    sim.usage(chat(1500, "b"))
    assert sim.usage(chat(1500, "a")).cached_tokens == 0
    assert sim.usage(chat(1500, "a")).cached_tokens == 1408


def test_common_tokens() -> None:
    tok = Tokenizer(words)
    a, b = tok.tokens("a b c d e"), tok.tokens("a b c x")
    assert [common_tokens(a, b), common_tokens(a, a), common_tokens(a, b"")] == [3, 5, 0]


def test_cache_sims_keep_scopes_apart_and_take_the_clock_from_a_header() -> None:
    sims = CacheSims(clock=lambda: 0.0)
    body = chat(1500)
    assert sims.openai(body, {"x-fake-cache-scope": "a"}).cached_tokens == 0
    assert sims.openai(body, {"x-fake-cache-scope": "b"}).cached_tokens == 0
    assert sims.openai(body, {"x-fake-cache-scope": "a"}).cached_tokens > 0
    late = {"x-fake-cache-scope": "a", "x-fake-clock": "10000"}
    assert sims.openai(body, late).cached_tokens == 0


# -- the fakes ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def anthropic_url() -> Iterator[str]:
    with ServerThread(FakeAnthropic(simulate_cache=True)) as srv:
        yield srv.url


@pytest.fixture(scope="module")
def openai_url() -> Iterator[str]:
    with ServerThread(FakeUpstream(simulate_cache=True)) as srv:
        yield srv.url


LONG = "You are a careful agent. " * 400  # ~2000 o200k tokens


@pytest.mark.parametrize("stream", [False, True])
def test_fake_anthropic_reports_simulated_cache_usage(anthropic_url: str, stream: bool) -> None:
    scope = {"x-fake-cache-scope": f"sdk-{stream}"}
    system: Any = [{"type": "text", "text": LONG, "cache_control": {"type": "ephemeral"}}]
    hi: Any = [{"role": "user", "content": "hello"}]
    with anthropic.Anthropic(base_url=anthropic_url, api_key="k", max_retries=0) as client:
        def usage() -> Any:
            if stream:
                with client.messages.stream(model="claude-opus-4-1", max_tokens=4,
                                            system=system, messages=hi,
                                            extra_headers=scope) as events:
                    return events.get_final_message().usage
            return client.messages.create(model="claude-opus-4-1", max_tokens=4,
                                          system=system, messages=hi,
                                          extra_headers=scope).usage

        first, second = usage(), usage()
    assert first.cache_read_input_tokens == 0 and first.cache_creation_input_tokens > 1024
    assert second.cache_read_input_tokens == first.cache_creation_input_tokens
    assert second.cache_creation_input_tokens == 0 and second.input_tokens == first.input_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_fake_openai_reports_simulated_cached_tokens(openai_url: str, stream: bool) -> None:
    scope = {"x-fake-cache-scope": f"sdk-{stream}"}
    msgs: Any = [{"role": "system", "content": LONG}, {"role": "user", "content": "hello"}]
    with openai.OpenAI(base_url=openai_url + "/v1", api_key="k", max_retries=0) as client:
        def usage() -> Any:
            if stream:
                chunks = list(client.chat.completions.create(
                    model="gpt-4o", messages=msgs, stream=True,
                    stream_options={"include_usage": True}, extra_headers=scope))
                return chunks[-1].usage
            return client.chat.completions.create(model="gpt-4o", messages=msgs,
                                                  extra_headers=scope).usage

        first, second = usage(), usage()
    assert first.prompt_tokens == second.prompt_tokens > 1024
    assert first.prompt_tokens_details.cached_tokens == 0
    assert second.prompt_tokens_details.cached_tokens == first.prompt_tokens // 128 * 128
