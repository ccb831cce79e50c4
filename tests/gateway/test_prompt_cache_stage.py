"""The prompt_cache stage through a running gateway: the official openai and anthropic SDKs in
front, fake upstreams behind that record what they received (and, for two tests, simulate
the providers' prompt caches). Off, the client's bytes go through untouched; on, the
upstream body differs only by what the policy enables, and the caches hit."""

from __future__ import annotations

import hashlib
import random
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from gateway.errors import ConfigError
from gateway.policy import load_policy
from gateway.prompt_cache.relocate import MARKER
from gateway.testing.fake_anthropic import FakeAnthropic
from gateway.testing.fake_upstream import FakeUpstream
from gateway.testing.server import ServerThread
from tests.conftest import DEFAULT_POLICY, GatewayServer

KEY_ENV = "GATEWAY_TEST_PROMPT_CACHE_KEY"
UPSTREAM_KEY = "sk-ant-upstream"
OFF = DEFAULT_POLICY + "\n[prompt_cache]\nenabled = false\n"
NOT_IN_PIPELINE = DEFAULT_POLICY + '\n[pipeline]\nstages = ["cache", "route", "admission"]\n'
#: The stage also on prompts too short for any provider to cache (which it leaves alone by
#: default), so that small bodies show each transform.
ANY_LENGTH = DEFAULT_POLICY + "\n[prompt_cache]\ndefault_min_tokens = 0\nmin_tokens = {}\n"
#: A system prompt long enough to cache (~2,000 tokens), with a time line near its top.
RULES = "\n".join(f"Rule {i}: help the traveller with booking change number {i}, politely "
                  "and in full sentences, checking the fare rules first." for i in range(100))
TOOLS = [{"name": n, "description": f"The {n} tool.",
          "input_schema": {"type": "object", "properties": {"b": {"type": "string"},
                                                            "a": {"type": "string"}}}}
         for n in ("search", "book", "cancel", "refund")]
OPENAI_TOOLS = [{"type": "function", "function": {"name": t["name"],
                                                  "description": t["description"],
                                                  "parameters": t["input_schema"]}}
                for t in TOOLS]


def system(minute: int) -> str:
    return f"# Airline agent\n{time_line(minute)}\n{RULES}"


def time_line(minute: int) -> str:
    return f"The current time is 2024-05-15 10:{minute:02d}:00 EST."


def moved(*lines: str) -> str:
    """The block that ends a request whose system prompt lost ``lines``."""
    return "\n".join([MARKER, *lines])


@pytest.fixture(scope="module")
def claude_server() -> Iterator[tuple[FakeAnthropic, str]]:
    app = FakeAnthropic(api_key=UPSTREAM_KEY, simulate_cache=True)
    with ServerThread(app) as srv:
        yield app, srv.url


@pytest.fixture(scope="module")
def openai_sim_server() -> Iterator[tuple[FakeUpstream, str]]:
    app = FakeUpstream(simulate_cache=True)
    with ServerThread(app) as srv:
        yield app, srv.url


@pytest.fixture
def claude(claude_server: tuple[FakeAnthropic, str]) -> FakeAnthropic:
    claude_server[0].clear()
    return claude_server[0]


@pytest.fixture
def sim(openai_sim_server: tuple[FakeUpstream, str]) -> FakeUpstream:
    openai_sim_server[0].clear()
    return openai_sim_server[0]


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@pytest.fixture
def make(make_gateway: Callable[..., GatewayServer], claude_server: tuple[FakeAnthropic, str],
         openai_sim_server: tuple[FakeUpstream, str],
         monkeypatch: pytest.MonkeyPatch) -> Callable[..., GatewayServer]:
    monkeypatch.setenv(KEY_ENV, UPSTREAM_KEY)
    extra = f"""
[upstreams.claude]
type = "anthropic"
forward_headers = ["x-fake-*"]
base_url = "{claude_server[1]}"
api_key_env = "{KEY_ENV}"

[upstreams.sim]
type = "openai"
forward_headers = ["x-fake-*"]
base_url = "{openai_sim_server[1]}/v1"

[models.claude]
targets = [{{ upstream = "claude", model = "claude-sonnet-4-5" }}]

[models."claude-same"]
targets = [{{ upstream = "claude", model = "claude-same" }}]

[models.same]
targets = [{{ upstream = "fake", model = "same" }}]

[models.gpt]
targets = [{{ upstream = "sim", model = "gpt-4o" }}]

[upstreams.native]
type = "openai"
forward_headers = ["x-fake-*"]
base_url = "{openai_sim_server[1]}/v1"
native_responses = true

[models."gpt-native"]
targets = [{{ upstream = "native", model = "gpt-4o" }}]

[[auth.keys]]
id = "team-a"
sha256 = "{sha('key-a')}"

[[auth.keys]]
id = "team-b"
sha256 = "{sha('key-b')}"
"""

    def build(policy: str = DEFAULT_POLICY) -> GatewayServer:
        return make_gateway(extra, policy=policy)
    return build


def aclient(gw: GatewayServer, key: str = "key-a", **kw: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key=key, max_retries=0, **kw)


def oclient(gw: GatewayServer, key: str = "key-a", **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.v1, api_key=key, max_retries=0, **kw)


# -- off: byte for byte ------------------------------------------------------------------------

RAW_CHAT = (b'{ "messages" : [{"content": "Now: 2024-05-15 10:00", "role": "system"},'
            b' {"role":"user","content":"hi"}], "model":"same",\n "temperature": 1.0,'
            b' "tools": [{"type":"function","function":{"name":"b","parameters":{}}},'
            b'{"type":"function","function":{"name":"a","parameters":{}}}]}')
RAW_MESSAGES = (b'{"max_tokens": 8, "model": "claude-same", "system": "Now: 2024-05-15 10:00",'
                b' "tools": [{"name": "b", "input_schema": {"type": "object"}},'
                b' {"name": "a", "input_schema": {"type": "object"}}],'
                b' "messages": [{"role": "user", "content": "hi"}]}')


@pytest.mark.parametrize("policy", [OFF, NOT_IN_PIPELINE], ids=["disabled", "not-in-pipeline"])
def test_with_the_stage_off_the_clients_bytes_go_through_untouched(make, fake, claude, policy):
    gw = make(policy)
    headers = {"authorization": "Bearer key-a", "content-type": "application/json"}
    r = httpx.post(gw.v1 + "/chat/completions", content=RAW_CHAT, headers=headers)
    assert r.status_code == 200, r.text
    assert fake.records[-1].body == RAW_CHAT
    r = httpx.post(gw.url + "/v1/messages", content=RAW_MESSAGES,
                   headers={**headers, "anthropic-version": "2023-06-01"})
    assert r.status_code == 200, r.text
    assert claude.records[-1].body == RAW_MESSAGES
    records = gw.logged(2)
    assert [(r["prompt_cache_breakpoints"], r["prompt_cache_moved"]) for r in records] == \
        [(None, None)] * 2


def test_a_prompt_too_short_to_cache_is_left_alone(make, fake):
    gw = make()  # the default policy: nothing under 1,024 tokens (estimated) is shaped
    headers = {"authorization": "Bearer key-a", "content-type": "application/json"}
    httpx.post(gw.v1 + "/chat/completions", content=RAW_CHAT, headers=headers)
    assert fake.records[-1].body == RAW_CHAT
    assert gw.logged(1)[0]["prompt_cache_moved"] is None


def test_with_the_stage_on_the_body_differs_only_by_the_enabled_transforms(make, fake, claude):
    gw = make(ANY_LENGTH)
    headers = {"authorization": "Bearer key-a", "content-type": "application/json"}
    # A system prompt that is only the time stays as it is: moving it would empty it.
    httpx.post(gw.v1 + "/chat/completions", content=RAW_CHAT, headers=headers)
    sent, client = fake.records[-1].json, orjson.loads(RAW_CHAT)
    assert sent.pop("prompt_cache_key").startswith("gw-")
    assert sent["tools"] == client["tools"][::-1]  # sorted by name
    del sent["tools"], client["tools"]
    assert sent == client  # nothing else changed
    # A longer one: the time line moves to the end of the user's message, verbatim.
    chat = orjson.loads(RAW_CHAT)
    chat["messages"][0]["content"] = f"{RULES}\nNow: 2024-05-15 10:00"
    httpx.post(gw.v1 + "/chat/completions", content=orjson.dumps(chat), headers=headers)
    sent = fake.records[-1].json
    assert sent["messages"] == [{"role": "system", "content": RULES},
                                {"role": "user", "content": "hi\n\n" +
                                 moved("Now: 2024-05-15 10:00")}]
    # With no minimum length: the rolling marker on the tail, the time after it.
    messages = orjson.loads(RAW_MESSAGES)
    messages["system"] = f"{RULES}\nNow: 2024-05-15 10:00"
    httpx.post(gw.url + "/v1/messages", content=orjson.dumps(messages),
               headers={**headers, "anthropic-version": "2023-06-01"})
    sent = claude.records[-1].json
    assert list(sent) == ["model", "max_tokens", "tools", "system", "messages"]
    assert [t["name"] for t in sent["tools"]] == ["a", "b"]
    assert sent["system"] == [{"type": "text", "text": RULES,
                               "cache_control": {"type": "ephemeral"}}]
    assert sent["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": moved("Now: 2024-05-15 10:00")}]}]
    records = gw.logged(3)
    assert [(r["prompt_cache_breakpoints"], r["prompt_cache_moved"]) for r in records] == \
        [(0, {}), (0, {"timestamp": 1}), (3, {"timestamp": 1})]


def test_other_endpoints_are_not_shaped(make, fake):
    gw = make()
    raw = b'{"model": "same", "prompt": "Now: 2024-05-15 10:00"}'
    r = httpx.post(gw.v1 + "/completions", content=raw,
                   headers={"authorization": "Bearer key-a", "content-type": "application/json"})
    assert r.status_code == 200 and fake.records[-1].body == raw


# -- on: both SDKs, both upstream APIs -----------------------------------------------------------

def test_anthropic_sdk_to_claude_gets_markers_and_the_time_after_them(make, claude):
    gw = make()
    scope = {"x-fake-cache-scope": uuid.uuid4().hex}
    with aclient(gw, default_headers=scope) as c:
        c.messages.create(model="claude", max_tokens=16, system=system(0), tools=TOOLS,
                          messages=[{"role": "user", "content": "Change my flight."}])
    sent = claude.records[-1].json
    assert [t["name"] for t in sent["tools"]] == ["book", "cancel", "refund", "search"]
    assert "cache_control" not in sent["tools"][-1]  # the tools alone: under 1024 tokens
    assert sent["system"] == [{"type": "text", "text": "# Airline agent\n" + RULES,
                               "cache_control": {"type": "ephemeral"}}]
    assert sent["messages"][0]["content"] == [
        {"type": "text", "text": "Change my flight.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": moved(time_line(0))}]
    [record] = gw.logged(1)
    assert record["prompt_cache_breakpoints"] == 2
    assert record["prompt_cache_moved"] == {"timestamp": 1}
    assert record["cache_write_tokens"] > 0


def test_openai_sdk_to_claude_is_shaped_after_translation(make, claude):
    gw = make()
    with oclient(gw, default_headers={"x-fake-cache-scope": uuid.uuid4().hex}) as c:
        c.chat.completions.create(model="claude", tools=OPENAI_TOOLS, messages=[
            {"role": "system", "content": system(0)}, {"role": "user", "content": "hi"}])
    sent = claude.records[-1].json
    assert "prompt_cache_key" not in sent
    assert sent["system"][0]["text"] == "# Airline agent\n" + RULES
    assert sent["messages"][-1]["content"][-1]["text"] == moved(time_line(0))
    assert gw.logged(1)[0]["prompt_cache_breakpoints"] == 2


def test_anthropic_sdk_to_an_openai_upstream_gets_a_final_note_and_a_cache_key(make, sim):
    gw = make()
    with aclient(gw) as c:
        c.messages.create(model="gpt", max_tokens=16, system=system(0), tools=TOOLS,
                          messages=[{"role": "user", "content": "hi"}])
    sent = sim.records[-1].json
    assert sent["messages"][0] == {"role": "system", "content": "# Airline agent\n" + RULES}
    assert sent["messages"][-1] == {"role": "user", "content": "hi\n\n" + moved(time_line(0))}
    assert sent["prompt_cache_key"].startswith("gw-")
    assert "cache_control" not in orjson.dumps(sent).decode()


def test_each_key_has_its_own_history_and_cache_key(make, fake):
    gw = make()

    def send(key: str, weather: str) -> dict[str, Any]:
        with oclient(gw, key) as c:
            c.chat.completions.create(model="same", messages=[
                {"role": "system", "content": f"{RULES}\nWeather: {weather}"},
                {"role": "user", "content": "hi"}])
        return dict(fake.records[-1].json)

    send("key-a", "sunny")
    a = send("key-a", "rain")  # changed once since key a's last request: maybe an edit
    assert a["messages"][0]["content"] == f"{RULES}\nWeather: rain"
    a = send("key-a", "snow")  # changed again: volatile, moved
    assert a["messages"][0]["content"] == RULES
    assert a["messages"][-1]["content"] == "hi\n\n" + moved("Weather: snow")
    b = send("key-b", "snow")  # key b has seen nothing: as the client wrote it
    assert b["messages"][0]["content"] == f"{RULES}\nWeather: snow"
    assert b["prompt_cache_key"] != a["prompt_cache_key"]
    assert [r["prompt_cache_moved"] for r in gw.logged(4)] == [{}, {}, {"changed": 1}, {}]


# -- the caches hit (simulated providers) -------------------------------------------------------

def conversation(turns: int) -> Iterator[tuple[str, list[Any], list[dict[str, Any]]]]:
    """A volatile agent conversation: each request a new time in the system prompt, and the
    tools in another order (as MCP clients send them)."""
    rng = random.Random(7)
    messages: list[dict[str, Any]] = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"question {turn}: " + "details " * 30})
        yield system(turn), rng.sample(TOOLS, len(TOOLS)), list(messages)
        messages.append({"role": "assistant", "content": f"answer {turn} " + "words " * 30})


@pytest.mark.parametrize(("policy", "reads"), [(OFF, False), (DEFAULT_POLICY, True)],
                         ids=["off", "on"])
def test_claude_reads_the_cache_on_a_volatile_conversation_only_with_the_stage(
        make, claude, policy, reads):
    gw = make(policy)
    with aclient(gw, default_headers={"x-fake-cache-scope": uuid.uuid4().hex}) as c:
        for text, tools, messages in conversation(4):
            c.messages.create(model="claude", max_tokens=8, system=text, tools=tools,
                              messages=messages)
    records = gw.logged(4)
    read = [r["cache_read_tokens"] or 0 for r in records]
    if reads:  # each request reads (nearly) all of the one before it
        assert read[0] == 0
        assert all(n >= 0.9 * before["prompt_tokens"]
                   for n, before in zip(read[1:], records, strict=False))
    else:
        assert read == [0, 0, 0, 0]


@pytest.mark.parametrize(("policy", "reads"), [(OFF, False), (DEFAULT_POLICY, True)],
                         ids=["off", "on"])
def test_openai_caches_a_volatile_conversation_only_with_the_stage(make, sim, policy, reads):
    gw = make(policy)
    with oclient(gw, default_headers={"x-fake-cache-scope": uuid.uuid4().hex}) as c:
        for text, tools, messages in conversation(3):
            c.chat.completions.create(
                model="gpt", messages=[{"role": "system", "content": text}, *messages],
                tools=[{"type": "function", "function": {
                    "name": t["name"], "description": t["description"],
                    "parameters": t["input_schema"]}} for t in tools])
    records = gw.logged(3)
    cached = [r["cached_tokens"] or 0 for r in records]
    if reads:  # OpenAI caches in 128-token steps: most of the request before
        assert cached[0] == 0
        assert all(n >= 0.9 * before["prompt_tokens"]
                   for n, before in zip(cached[1:], records, strict=False))
    else:
        assert cached == [0, 0, 0]


# -- the policy --------------------------------------------------------------------------------

def test_a_bad_pattern_is_a_config_error_naming_the_key(tmp_path: Path):
    path = tmp_path / "policy.toml"
    path.write_text('[prompt_cache]\npatterns = ["Weather: \\\\w+", "(unclosed"]\n')
    with pytest.raises(ConfigError) as caught:
        load_policy(path)
    assert "prompt_cache: patterns[1]: invalid regular expression '(unclosed'" in \
        str(caught.value)
    path.write_text('[prompt_cache]\nttl = "2h"\n')
    with pytest.raises(ConfigError, match="prompt_cache.ttl"):
        load_policy(path)
    path.write_text('[prompt_cache]\nlookback_blocks = 30\n')
    with pytest.raises(ConfigError, match="prompt_cache.lookback_blocks: must be <= 20"):
        load_policy(path)


def test_policy_patterns_move_what_they_match(make, fake):
    gw = make(ANY_LENGTH + 'patterns = ["Weather: \\\\w+"]\n')
    with oclient(gw) as c:
        c.chat.completions.create(model="same", messages=[
            {"role": "system", "content": f"{RULES}\nWeather: sunny"},
            {"role": "user", "content": "hi"}])
    assert fake.records[-1].json["messages"][0]["content"] == RULES
    assert gw.logged(1)[0]["prompt_cache_moved"] == {"custom": 1}


# -- the Responses API -------------------------------------------------------------------------

RESPONSES_TOOLS: Any = [{"type": "function", "name": t["name"], "description": t["description"],
                         "parameters": t["input_schema"]} for t in TOOLS]


def test_a_responses_request_is_shaped_after_translation(make, sim, claude):
    gw = make()
    with oclient(gw) as c:
        c.responses.create(model="gpt", instructions=system(0), input="hi",
                           tools=RESPONSES_TOOLS)
        c.responses.create(model="claude", instructions=system(0), input="hi")
    sent = sim.records[-1].json
    assert sent["messages"][0] == {"role": "system", "content": "# Airline agent\n" + RULES}
    assert sent["messages"][-1] == {"role": "user", "content": "hi\n\n" + moved(time_line(0))}
    assert sent["prompt_cache_key"].startswith("gw-")
    assert [t["function"]["name"] for t in sent["tools"]] == sorted(t["name"] for t in TOOLS)
    to_claude = claude.records[-1].json
    assert to_claude["system"][0]["text"] == "# Airline agent\n" + RULES
    assert to_claude["messages"][-1]["content"][-1]["text"] == moved(time_line(0))


def test_a_native_responses_request_gets_a_cache_key_and_its_text_as_sent(make, sim):
    gw = make()
    with oclient(gw) as c:
        c.responses.create(model="gpt-native", instructions=system(0), input="hi",
                           tools=RESPONSES_TOOLS)
        c.responses.create(model="gpt-native", instructions=system(0), input="hi",
                           tools=list(reversed(RESPONSES_TOOLS)))
        c.responses.create(model="gpt-native", instructions=system(1), input="hi",
                           prompt_cache_key="mine")
    first, second, third = (r.json for r in sim.records[-3:])
    assert sim.records[-1].path == "/v1/responses"
    assert first["instructions"] == system(0) and first["input"] == "hi"
    assert first["prompt_cache_key"].startswith("gw-")
    assert second["prompt_cache_key"] == first["prompt_cache_key"]  # tools in one order
    # (the same conversation: its opening input; another opening is another conversation)
    assert second["tools"] == first["tools"]
    # the client's own is kept, namespaced by its gateway key
    assert third["prompt_cache_key"] == gw.gateway.cache_keys.client("team-a", "mine")
