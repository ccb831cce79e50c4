"""Tenants under one upstream key (issue 45: findings 2 (Responses), 5, 7, 10 (the purge)):
what one gateway key can reach of another's, tried over HTTP with two keys, as an attacker
holding key B would.

- 2: B continuing A's conversation by its ``previous_response_id`` (or a ``conversation``
  the upstream keeps) on a native Responses upstream;
- 5: B reading A's provider prompt cache by sending A's ``prompt_cache_key``, or computing
  it from A's key id and a guessed prompt; a client's own key shared by two keys;
- 7: B's writes evicting A's stored responses or cache entries; B's answers teaching the
  semantic cache's error bound that A's questions read;
- 10: purging namespace ``team`` taking key ``team:eng``'s entries (a glob), or ``t*``'s
  taking ``team``'s.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import httpx
import openai
import orjson
import pytest

from gateway.testing.fake_upstream import FakeUpstream
from gateway.testing.redis_server import RedisServer
from gateway.testing.server import ServerThread
from tests.conftest import DEFAULT_POLICY, GatewayServer
from tests.gateway.cache.test_cache_gateway import bag_of_words

A, B = "key-a", "key-b"
NATIVE = """
[upstreams.native]
type = "openai"
base_url = "{url}/v1"
native_responses = true

[models.native]
targets = [{{ upstream = "native", model = "native-upstream-model" }}]
"""
#: A system prompt long enough for OpenAI's prompt cache (~1,500 tokens), A's confidential.
CONFIDENTIAL = "\n".join(f"Clause {i}: the Acme merger closes on day {i} at a price of "
                         f"{100 + i} dollars a share, known to the deal team only."
                         for i in range(60))
#: Two deployment secrets, as GATEWAY_SECRET would hold them.
SECRET, OTHER_SECRET = "s" * 40, "t" * 40


def keys(*ids_and_secrets: tuple[str, str]) -> str:
    return "".join(f'\n[[auth.keys]]\nid = "{kid}"\n'
                   f'sha256 = "{hashlib.sha256(secret.encode()).hexdigest()}"\n'
                   for kid, secret in ids_and_secrets)


TWO_KEYS = keys(("team-a", A), ("team-b", B))


def sdk(gw: GatewayServer, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.v1, api_key=key, max_retries=0)


@pytest.fixture(autouse=True)
def deployment_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_SECRET", SECRET)


# -- 2: a conversation the upstream keeps ----------------------------------------------------

def test_key_b_cannot_continue_key_as_conversation_on_a_native_upstream(
        make_gateway: Callable[..., GatewayServer], fake_server: Any,
        fake: FakeUpstream) -> None:
    gw = make_gateway(NATIVE.format(url=fake_server.url) + TWO_KEYS)
    with sdk(gw, A) as a, sdk(gw, B) as b:
        mine = a.responses.create(model="native", input="The launch code is 0000.")
        with pytest.raises(openai.BadRequestError) as err:
            b.responses.create(model="native", input="What is the launch code?",
                               previous_response_id=mine.id)
        with pytest.raises(openai.BadRequestError) as conv:  # an object OpenAI keeps
            b.responses.create(model="native", input="Go on.", conversation="conv_of_a")
        # A continues its own, the upstream keeping it; its record is A's, not B's
        again = a.responses.create(model="native", input="Repeat it.",
                                   previous_response_id=mine.id)
        with pytest.raises(openai.NotFoundError):
            b.responses.retrieve(mine.id)
    assert err.value.status_code == 400 and err.value.code == "previous_response_not_found"
    assert err.value.message.endswith(f"Previous response with id '{mine.id}' not found.")
    assert conv.value.param == "conversation"
    assert again.output_text
    sent = [orjson.loads(r.body) for r in fake.records]
    assert [s.get("previous_response_id") for s in sent] == [None, mine.id]  # B's: none


# -- 5: provider prompt-cache keys -----------------------------------------------------------

@pytest.fixture(scope="module")
def openai_sim() -> Iterator[tuple[FakeUpstream, str]]:
    app = FakeUpstream(simulate_cache=True)
    with ServerThread(app) as srv:
        yield app, srv.url


@pytest.fixture
def sim(openai_sim: tuple[FakeUpstream, str]) -> FakeUpstream:
    openai_sim[0].clear()
    return openai_sim[0]


def sim_gateway(make_gateway: Callable[..., GatewayServer], url: str) -> GatewayServer:
    return make_gateway(f"""
[upstreams.sim]
type = "openai"
base_url = "{url}/v1"

[models.gpt]
targets = [{{ upstream = "sim", model = "gpt-4o" }}]
""" + TWO_KEYS)


def ask(gw: GatewayServer, key: str, **extra: Any) -> Any:
    with sdk(gw, key) as c:
        return c.chat.completions.create(model="gpt", messages=[
            {"role": "system", "content": CONFIDENTIAL}, {"role": "user", "content": "hi"}],
            **extra)


def cached_tokens(answer: Any) -> int:
    return int(answer.usage.prompt_tokens_details.cached_tokens or 0)


def test_key_b_sending_key_as_derived_cache_key_does_not_reach_as_prompt_cache(
        make_gateway: Callable[..., GatewayServer], openai_sim: tuple[FakeUpstream, str],
        sim: FakeUpstream) -> None:
    gw = sim_gateway(make_gateway, openai_sim[1])
    ask(gw, A)
    assert cached_tokens(ask(gw, A)) > 1000  # A's own prompt, cached where A's key routes
    a_key = sim.records[-1].json["prompt_cache_key"]
    guess = ask(gw, B, prompt_cache_key=a_key)  # B guesses A's prompt right, A's key too
    assert cached_tokens(guess) == 0  # nothing tells B whether its guess was right
    assert sim.records[-1].json["prompt_cache_key"] != a_key


def test_the_derived_cache_key_is_not_computable_from_the_key_id_and_the_prompt(
        make_gateway: Callable[..., GatewayServer], openai_sim: tuple[FakeUpstream, str],
        sim: FakeUpstream, monkeypatch: pytest.MonkeyPatch) -> None:
    ask(sim_gateway(make_gateway, openai_sim[1]), A)
    sent = sim.records[-1].json["prompt_cache_key"]
    # what anyone knowing the key id and guessing the prompt could compute (the old scheme)
    static = orjson.dumps([None, [{"role": "system", "content": CONFIDENTIAL}]])
    public = "gw-" + hashlib.blake2b(b"team-a\0" + static, digest_size=8).hexdigest()
    assert sent != public
    monkeypatch.setenv("GATEWAY_SECRET", OTHER_SECRET)  # another deployment: another key
    ask(sim_gateway(make_gateway, openai_sim[1]), A)
    assert sim.records[-1].json["prompt_cache_key"] != sent


def test_a_clients_own_cache_key_is_namespaced_by_its_gateway_key(
        make_gateway: Callable[..., GatewayServer], fake_server: Any,
        fake: FakeUpstream) -> None:
    gw = make_gateway(NATIVE.format(url=fake_server.url) + TWO_KEYS)
    for key in (A, A, B):
        with sdk(gw, key) as c:
            c.chat.completions.create(model="fake-model", prompt_cache_key="conv-1",
                                      messages=[{"role": "user", "content": "hi"}])
            c.responses.create(model="native", input="hi", prompt_cache_key="conv-1")
    sent = [r.json["prompt_cache_key"] for r in fake.records]
    chat_a, chat_a2, chat_b = sent[0::2]
    native_a, native_a2, native_b = sent[1::2]
    assert chat_a == chat_a2 and native_a == native_a2  # one key's value: one key upstream
    assert "conv-1" not in sent and chat_b != chat_a and native_b != native_a
    assert len(chat_a) <= 64  # OpenAI's limit


# -- 7: shared memory ------------------------------------------------------------------------

def test_key_b_filling_the_response_store_does_not_evict_key_as_responses(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream) -> None:
    gw = make_gateway("\n[responses]\nmax_bytes = 16384\n" + TWO_KEYS)
    with sdk(gw, A) as a, sdk(gw, B) as b:
        mine = a.responses.create(model="fake-model", input="Remember: blue.")
        theirs = [b.responses.create(model="fake-model", input=f"Filler {i}.").id
                  for i in range(40)]
        assert a.responses.retrieve(mine.id).id == mine.id
        chained = a.responses.create(model="fake-model", input="Which colour?",
                                     previous_response_id=mine.id)
        assert b.responses.retrieve(theirs[-1]).id == theirs[-1]
        with pytest.raises(openai.NotFoundError):  # B's over its share: its own went
            b.responses.retrieve(theirs[0])
    assert chained.output_text


def test_key_b_filling_the_response_cache_does_not_evict_key_as_entries(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream) -> None:
    policy = DEFAULT_POLICY + "\n[cache]\nenabled = true\nmax_temperature = 1.0\n"
    gw = make_gateway('\n[cache]\nenabled = true\nbackend = "memory"\nmax_entries = 4\n'
                      + TWO_KEYS, policy=policy)

    def chat(key: str, text: str) -> str:
        with sdk(gw, key) as c:
            r = c.chat.completions.with_raw_response.create(
                model="fake-model", messages=[{"role": "user", "content": text}])
            gw.run(gw.gateway.cache.drain())  # type: ignore[union-attr]
            return r.headers["x-cache"]

    assert chat(A, "A's question") == "miss"
    assert [chat(B, f"B's question {i}") for i in range(8)] == ["miss"] * 8
    assert chat(A, "A's question") == "hit"


QUESTION = "what is the best way to learn to cook italian food at home"
EXTRA = ["please", "quickly", "today", "cheaply", "easily", "properly", "well", "really",
         "truly", "simply", "fully", "safely", "alone", "slowly", "gently", "calmly",
         "happily", "rightly", "wisely", "boldly"]


def test_key_bs_answers_do_not_open_the_error_bound_for_key_a(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream) -> None:
    policy = DEFAULT_POLICY + """
[cache]
enabled = true
semantic = true
max_error_rate = 0.2
explore_share = 0
operating_point = { similarity = 0.5, verifier = 0.0 }
lookup_budget_ms = 60000
"""
    gw = make_gateway('\n[cache]\nenabled = true\nbackend = "memory"\n' + TWO_KEYS,
                      policy=policy, embed=bag_of_words)

    def chat(key: str, text: str) -> str:
        with sdk(gw, key) as c:
            r = c.chat.completions.with_raw_response.create(
                model="fake-model", messages=[{"role": "user", "content": text}])
            gw.run(gw.gateway.cache.drain())  # type: ignore[union-attr]
            return r.headers["x-cache"]

    chat(B, QUESTION)
    taught = [chat(B, f"{QUESTION} {word}") for word in EXTRA]
    assert "hit" in taught[-4:]  # B's answers agreed: B's bound serves B's paraphrases
    chat(A, QUESTION)
    assert [chat(A, f"{QUESTION} {word}") for word in EXTRA[-3:]] == ["miss"] * 3  # cold


# -- 10: the purge ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


class Purging:
    """A gateway whose cache lives in Redis, with keys ``team``, ``team:eng`` and ``t*``
    (secrets ``k-team``, ``k-eng``, ``k-glob``), each with one entry cached."""

    KEYS: ClassVar[dict[str, str]] = {"team": "k-team", "team:eng": "k-eng", "t*": "k-glob"}

    def __init__(self, make_gateway: Callable[..., GatewayServer], redis: RedisServer,
                 prefix: str) -> None:
        policy = DEFAULT_POLICY + ("\n[cache]\nenabled = true\nmax_temperature = 1.0\n"
                                   "lookup_timeout_ms = 5000\n")  # a loaded machine's Redis
        self.gw = make_gateway(f'\n[cache]\nenabled = true\nbackend = "redis"\n'
                               f'redis_url = "{redis.url}"\nprefix = "{prefix}"\n'
                               'semantic = false\n' + keys(*self.KEYS.items()), policy=policy)
        assert [self.chat(k) for k in self.KEYS] == ["miss"] * 3

    def chat(self, key_id: str) -> str:
        with sdk(self.gw, self.KEYS[key_id]) as c:
            r = c.chat.completions.with_raw_response.create(
                model="fake-model", messages=[{"role": "user", "content": "cached?"}])
            self.gw.run(self.gw.gateway.cache.drain())  # type: ignore[union-attr]
            return r.headers["x-cache"]

    def purge(self, key_id: str) -> Any:
        """``key_id`` purges its own namespace: how many entries went."""
        r = httpx.post(self.gw.url + "/admin/cache/purge", json={"namespace": key_id},
                       headers={"authorization": f"Bearer {self.KEYS[key_id]}"})
        assert r.status_code == 200, r.text
        return r.json()["removed"]


def test_purging_team_leaves_the_entries_of_key_team_eng(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream,
        redis_server: RedisServer) -> None:
    cache = Purging(make_gateway, redis_server, "prefixed:")
    assert cache.purge("team") == 1  # its own entry
    assert [cache.chat(k) for k in cache.KEYS] == ["miss", "hit", "hit"]


def test_a_namespace_with_glob_characters_purges_itself_alone(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream,
        redis_server: RedisServer) -> None:
    cache = Purging(make_gateway, redis_server, "globbed:")
    assert cache.purge("t*") == 1  # its own entry; not team's, not team:eng's
    assert [cache.chat(k) for k in cache.KEYS] == ["hit", "hit", "miss"]
