"""The compress stage through a running gateway: the official openai and anthropic SDKs in
front, fake upstreams behind that record what they received. A retrieval prompt's context
shrinks to the budget while its instruction, its question, its protected spans and whatever
the client marked for caching arrive byte for byte; the gate, the header, streaming and
degraded mode as a client sees them."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from gateway.testing.fake_anthropic import FakeAnthropic
from gateway.testing.fake_upstream import FakeUpstream
from gateway.testing.server import ServerThread
from tests.conftest import DEFAULT_POLICY, GatewayServer
from tests.gateway.compression.test_scoring import ScoringUpstream

KEY_ENV = "GATEWAY_TEST_COMPRESS_KEY"
ALWAYS = DEFAULT_POLICY + "\n[compression]\nenabled = true\ngate = \"always\"\nmin_tokens = 200\n"
GATED = DEFAULT_POLICY + "\n[compression]\nenabled = true\nmin_tokens = 200\n"

INSTRUCTION = ("Write a high-quality answer for the given question using only the provided "
               "search results (some of which might be irrelevant).")
QUESTION = "Question: how many people live in Zanzibar Falls?\nAnswer:"
TOWNS = ["Oakridge", "Millbrook", "Cedar Hollow", "Fairhaven", "Riverton", "Ashford",
         "Brookfield", "Clearwater", "Dunmore", "Elmstead", "Glenwood", "Hillcrest",
         "Ironbridge", "Juniper Bay", "Kingsport", "Lakeview", "Maplewood", "Northgate",
         "Zanzibar Falls", "Pinecrest"]


def document(i: int, town: str) -> str:
    return (f"Document [{i + 1}](Title: {town}) {town} is a small town on route A{i + 7} "
            f"founded in 18{i + 10}. {town} has a population of {1000 + 137 * i:,} and its "
            f"post code is ZX-{4000 + i}. The town's economy rests on farming, a weekly "
            f"market and a little tourism along the river; its council meets every second "
            f"Tuesday at the old hall on Station Road.")


DOCS = [document(i, town) for i, town in enumerate(TOWNS)]
GOLD = DOCS[18]
PROMPT = INSTRUCTION + "\n\n" + "\n".join(DOCS) + "\n\n" + QUESTION


@pytest.fixture
def claude(claude_server: tuple[FakeAnthropic, str]) -> FakeAnthropic:
    claude_server[0].clear()
    return claude_server[0]


@pytest.fixture
def make(make_gateway: Callable[..., GatewayServer], claude_server: tuple[FakeAnthropic, str],
         monkeypatch: pytest.MonkeyPatch) -> Callable[..., GatewayServer]:
    monkeypatch.setenv(KEY_ENV, "sk-ant-upstream")
    extra = f"""
[upstreams.claude]
type = "anthropic"
forward_headers = ["x-fake-*"]
base_url = "{claude_server[1]}"
api_key_env = "{KEY_ENV}"

[models.claude]
targets = [{{ upstream = "claude", model = "claude-sonnet-4-5" }}]
"""

    def build(policy: str = ALWAYS, more: str = "") -> GatewayServer:
        return make_gateway(extra + more, policy=policy)
    return build


def oclient(gw: GatewayServer, **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0, **kw)


def aclient(gw: GatewayServer, **kw: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0, **kw)


def ask(gw: GatewayServer, content: Any = PROMPT, **kw: Any) -> Any:
    with oclient(gw) as c:
        return c.chat.completions.with_raw_response.create(
            model="fake-model", messages=[{"role": "user", "content": content}], **kw)


def assert_compressed_retrieval_prompt(sent: str) -> None:
    """The instruction first and the question last, byte for byte; the gold document kept
    whole (its numbers and ids too); at most a quarter of the documents' tokens left."""
    assert sent.startswith(INSTRUCTION + "\n\n")
    assert sent.endswith("\n\n" + QUESTION)
    assert GOLD in sent
    kept = [d for d in DOCS if d in sent]
    assert 1 <= len(kept) <= 6
    middle = sent[len(INSTRUCTION) + 2:-len(QUESTION) - 2]
    assert middle.split("\n") == kept or sorted(middle.split("\n")) == sorted(kept)  # whole
    assert len(sent) < len(PROMPT) / 2.5


# -- off ------------------------------------------------------------------------------------

def test_off_by_default_the_body_goes_through_untouched(make, fake):
    gw = make(DEFAULT_POLICY)
    raw = ask(gw)
    assert "x-gateway-compression" not in raw.headers
    assert fake.records[-1].json["messages"][0]["content"] == PROMPT
    [record] = gw.logged(1)
    assert (record["compression"], record["compress_skip"], record["tokens_before"]) == \
        (None, None, None)


# -- on: both APIs ----------------------------------------------------------------------------

def test_openai_sdk_a_retrieval_prompt_is_cut_and_its_question_arrives_byte_for_byte(make, fake):
    gw = make()
    raw = ask(gw)
    assert raw.parse().choices[0].message.content
    sent = fake.records[-1].json["messages"][0]["content"]
    assert_compressed_retrieval_prompt(sent)
    [record] = gw.logged(1)
    assert record["compress_skip"] is None
    assert record["compression"] >= 3.0
    assert record["tokens_before"] > 4 * record["tokens_after"] * 0.9
    assert record["compress_ms"] > 0
    assert float(raw.headers["x-gateway-compression"]) == pytest.approx(record["compression"],
                                                                        abs=0.01)
    metrics = gw.gateway.metrics.render().decode()
    assert 'gateway_compression_total{model="fake-upstream-model",outcome="compressed"} 1.0' in metrics


def test_anthropic_sdk_the_same_and_content_marked_for_caching_is_untouched(make, claude):
    gw = make()
    cached = "Reference notes, cached:\n\n" + "\n\n".join(DOCS[:10])
    with aclient(gw) as c:
        c.messages.create(model="claude", max_tokens=16, system="You answer briefly.",
                          messages=[{"role": "user", "content": [
                              {"type": "text", "text": cached,
                               "cache_control": {"type": "ephemeral"}},
                              {"type": "text", "text": PROMPT}]}])
    sent = claude.records[-1].json
    assert sent["system"] == "You answer briefly."
    first, second = sent["messages"][0]["content"]
    assert first == {"type": "text", "text": cached, "cache_control": {"type": "ephemeral"}}
    # The text after the marker (the prompt_cache stage adds its own on the tail) is cut.
    assert second.pop("cache_control", None) in (None, {"type": "ephemeral"})
    assert_compressed_retrieval_prompt(second["text"])
    with aclient(gw) as c:
        c.messages.create(model="claude", max_tokens=16,
                          messages=[{"role": "user", "content": PROMPT}])
    assert_compressed_retrieval_prompt(claude.records[-1].json["messages"][0]["content"])


def test_earlier_turns_are_left_alone_and_tool_results_are_cut(make, fake):
    gw = make()
    history = [{"role": "system", "content": "\n\n".join(DOCS)},
               {"role": "user", "content": PROMPT},
               {"role": "assistant", "content": "", "tool_calls": [{
                   "id": "call_1", "type": "function",
                   "function": {"name": "search", "arguments": "{}"}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "\n\n".join(DOCS)}]
    with oclient(gw) as c:
        c.chat.completions.create(model="fake-model", messages=history)  # type: ignore[arg-type]
    sent = fake.records[-1].json["messages"]
    assert sent[:3] == history[:3]
    result = sent[3]["content"]
    assert GOLD in result and len(result) < len(history[3]["content"]) / 2.5


def test_streaming_answers_are_unaffected(make, fake):
    gw = make()
    with oclient(gw) as c:
        chunks = list(c.chat.completions.create(
            model="fake-model", stream=True, messages=[{"role": "user", "content": PROMPT}]))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text and chunks[-1].choices[0].finish_reason == "stop"
    assert_compressed_retrieval_prompt(fake.records[-1].json["messages"][0]["content"])
    assert gw.logged(1)[0]["compression"] >= 3.0


# -- the header ------------------------------------------------------------------------------

def test_the_header_turns_it_off_or_sets_the_ratio(make, fake):
    gw = make()
    ask(gw, extra_headers={"x-gateway-compress": "off"})
    assert fake.records[-1].json["messages"][0]["content"] == PROMPT
    ask(gw, extra_headers={"x-gateway-compress": "2"})
    half = fake.records[-1].json["messages"][0]["content"]
    assert GOLD in half and len(PROMPT) / 3 < len(half) < len(PROMPT) * 0.6
    records = gw.logged(2)
    assert records[0]["compress_skip"] == "client_off"
    assert 1.7 <= records[1]["compression"] <= 2.2


@pytest.mark.parametrize("value", ["lots", "0.5", "nan", "1000"])
def test_a_bad_header_is_a_400_in_the_callers_format(make, fake, claude, value):
    gw = make()
    with pytest.raises(openai.BadRequestError) as exc:
        ask(gw, extra_headers={"x-gateway-compress": value})
    assert exc.value.status_code == 400
    assert "x-gateway-compress" in exc.value.message
    with aclient(gw) as c, pytest.raises(anthropic.BadRequestError) as aexc:
        c.messages.create(model="claude", max_tokens=16,
                          messages=[{"role": "user", "content": PROMPT}],
                          extra_headers={"x-gateway-compress": value})
    assert aexc.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert not fake.records and not claude.records


# -- the gate --------------------------------------------------------------------------------

def test_the_gate_skips_without_a_prefill_rate_and_when_it_does_not_pay(make, fake):
    gw = make(GATED)
    ask(gw)
    assert fake.records[-1].json["messages"][0]["content"] == PROMPT
    assert gw.logged(1)[0]["compress_skip"] == "no_prefill_rate"
    slow = GATED + '[compression.prefill_ms_per_token]\n"fake-model" = 1.0\n'
    fast = GATED + '[compression.prefill_ms_per_token]\n"fake-model" = 0.0001\n'
    for policy, skip in ((slow, None), (fast, "not_worth_it")):
        fake.clear()
        gw = make(policy)
        ask(gw)
        assert (fake.records[-1].json["messages"][0]["content"] == PROMPT) == (skip is not None)
        assert gw.logged(1)[0]["compress_skip"] == skip
    # A client's explicit ratio is its own decision.
    ask(gw, extra_headers={"x-gateway-compress": "4"})
    assert_compressed_retrieval_prompt(fake.records[-1].json["messages"][0]["content"])


def test_short_prompts_are_not_compressed(make, fake):
    gw = make(GATED.replace("min_tokens = 200", "min_tokens = 100000"))
    ask(gw)
    assert fake.records[-1].json["messages"][0]["content"] == PROMPT
    assert gw.logged(1)[0]["compress_skip"] == "short"


def test_the_prefill_rate_is_learned_from_streamed_answers(make, fake):
    gw = make(GATED.replace("min_tokens = 200", "min_tokens = 1"))
    with oclient(gw) as c:
        for n in range(10):  # short prompts of growing length, never compressed
            c.chat.completions.create(model="fake-model", stream=True, messages=[
                {"role": "user", "content": "word " * (50 * (n + 1))}]).close()
    rate = gw.gateway.compression.prefill("fake-model")
    gw.logged(10)
    assert rate.ms_per_token is not None and rate.ms_per_token >= 0


@pytest.fixture(scope="module")
def cache_sim_url() -> Iterator[str]:
    with ServerThread(FakeUpstream(simulate_cache=True)) as srv:
        yield srv.url


def test_the_prefill_rate_counts_only_what_the_provider_did_not_read_from_its_cache(
        make, cache_sim_url):
    """Agent turns on the same model read a long prefix from the provider's cache and answer
    fast; counted as prefilled tokens they would flatten the rate (and the gate would
    never compress): the rate is learned from the uncached tokens."""
    more = (f'[upstreams.sim]\ntype = "openai"\nforward_headers = ["x-fake-*"]\n'
            f'base_url = "{cache_sim_url}/v1"\n\n'
            '[models.cached]\ntargets = [{ upstream = "sim", model = "sim-model" }]\n')
    # (no per-conversation prompt_cache_key: every turn here shares one prefix and machine)
    gw = make(GATED.replace("min_tokens = 200", "min_tokens = 1")
              + "\n[prompt_cache]\nenabled = false\n", more)
    system = {"role": "system", "content": "Follow the airline policy. " * 800}
    with oclient(gw) as c:
        for _ in range(2):  # the provider caches the prefix
            c.chat.completions.create(model="cached", messages=[system])
        for n in range(16):
            words = 40 * (n % 4 + 1)
            user = {"role": "user", "content": f"case {n} " + "word " * words}
            agent_turn = n % 2 == 1  # the long cached prefix, then the new turn
            # the provider's TTFT: 2 ms per word it has to prefill
            list(c.chat.completions.create(
                model="cached", stream=True, stream_options={"include_usage": True},
                messages=[system, user] if agent_turn else [user],
                extra_headers={"x-fake-ttft-ms": str(2 * words)}))
    records = gw.logged(18)
    assert sum(1 for r in records if r["cached_tokens"]) >= 8  # agent turns read the prefix
    rate = gw.gateway.compression.prefill("cached").ms_per_token
    assert rate is not None and 0.5 < rate < 4.0


# -- degraded mode ---------------------------------------------------------------------------

LANES = """
[retry]
max_attempts = 1
[admission]
max_concurrency = 4
max_queue = 0
long_prompt_bytes = 4000
long_lane_share = 0.25
[compression]
enabled = true
degraded_ratio = 8.0
"""


async def test_a_long_prompt_that_would_be_shed_is_compressed_harder_and_served(make, fake):
    gw = make(LANES)
    client = httpx.AsyncClient(timeout=30)
    body = {"model": "fake-model", "messages": [{"role": "user", "content": PROMPT}]}
    hold = asyncio.create_task(client.post(
        gw.v1 + "/chat/completions", json=body,
        headers={"x-fake-ttft-ms": "5000", "x-gateway-compress": "off"}))
    await asyncio.to_thread(fake.wait_for, lambda recs: recs)
    async with httpx.AsyncClient() as c:
        r = await c.post(gw.v1 + "/chat/completions", json=body)
    hold.cancel()
    with pytest.raises(asyncio.CancelledError):
        await hold
    await client.aclose()
    assert r.status_code == 200, r.text
    assert r.headers["x-gateway-degraded"] == "compressed:queue_full"
    sent = orjson.loads(fake.records[-1].body)["messages"][0]["content"]
    assert sent.endswith(QUESTION) and len(sent) < 4000
    served = [rec for rec in gw.logged(2) if rec["status"] == 200]
    assert served[0]["shed"] == "compressed:queue_full" and served[0]["compression"] > 4


def test_an_answer_to_a_compressed_request_is_not_cached_as_the_whole_ones(make, fake):
    gw = make(more='\n[cache]\nenabled = true\nbackend = "memory"\nsemantic = false\n')
    first = ask(gw)  # compressed: the answer is to a quarter of the context
    assert first.headers["x-cache"] == "miss" and "x-gateway-compression" in first.headers
    second = ask(gw, extra_headers={"x-gateway-compress": "off"})
    assert second.headers["x-cache"] == "miss"  # nothing was stored
    assert fake.records[-1].json["messages"][0]["content"] == PROMPT
    gw.logged(2)  # the second request is over: its store is under way
    gw.run(gw.gateway.cache.drain())
    third = ask(gw, extra_headers={"x-gateway-compress": "off"})
    assert third.headers["x-cache"] == "hit"  # the whole context's answer was


# -- token_level: the fine pass ----------------------------------------------------------------

FINE = ALWAYS + "token_level = true\n"


def with_engine(gw: GatewayServer, **kw: Any) -> ScoringUpstream:
    """A fake local engine among the gateway's upstreams, scoring as the real one does."""
    engine = ScoringUpstream(**kw)
    engine.engine = SimpleNamespace(model="smollm2")  # what marks a local engine
    gw.gateway.upstreams["engine"] = engine
    return engine


def scored_texts(engine: ScoringUpstream) -> list[str]:
    return [t for body in engine.bodies for t in body["prompt"]]


def test_token_level_without_a_local_engine_compresses_coarse_alone(make, fake):
    gw = make(FINE)
    ask(gw)
    assert_compressed_retrieval_prompt(fake.records[-1].json["messages"][0]["content"])
    [record] = gw.logged(1)
    assert record["compress_fine"] == "no_engine" and record["compression"] >= 3.0


def test_token_level_thins_kept_documents_and_leaves_the_request_byte_for_byte(make, fake):
    gw = make(FINE)
    engine = with_engine(gw)
    raw = ask(gw)
    sent = fake.records[-1].json["messages"][0]["content"]
    assert sent.startswith(INSTRUCTION + "\n\n") and sent.endswith("\n\n" + QUESTION)
    [record] = gw.logged(1)
    assert record["compress_fine"] == "applied" and record["compression"] >= 3.9
    assert float(raw.headers["x-gateway-compression"]) >= 3.9
    # numbers and ids of the kept documents arrive byte for byte
    kept = [d for d in DOCS if d.split("(")[0] + "(" in sent]
    assert len(kept) > 5  # more documents than coarse alone keeps (at most 5 of 20)...
    assert [d for d in kept if d not in sent]  # ... some of them thinned
    for doc in kept:
        for span in re.findall(r"A\d+|18\d\d|\d,\d{3}|ZX-\d+", doc):
            assert span in sent
    assert all(INSTRUCTION not in t and "Question:" not in t for t in scored_texts(engine))


def test_a_failed_scoring_call_falls_back_to_the_coarse_result(make, fake):
    gw = make(FINE)
    with_engine(gw, status=503)
    ask(gw)
    assert_compressed_retrieval_prompt(fake.records[-1].json["messages"][0]["content"])
    [record] = gw.logged(1)
    assert record["compress_fine"] == "error" and record["compression"] >= 3.0


def test_the_gate_keeps_coarse_alone_when_only_it_pays(make, fake):
    slow = GATED + ('token_level = true\ntoken_level_ms_per_1k_tokens = 100000.0\n'
                    '[compression.prefill_ms_per_token]\n"fake-model" = 1.0\n')
    gw = make(slow)
    engine = with_engine(gw)
    ask(gw)
    assert_compressed_retrieval_prompt(fake.records[-1].json["messages"][0]["content"])
    assert gw.logged(1)[0]["compress_fine"] == "not_worth_it" and not engine.bodies


def test_anthropic_sdk_content_marked_for_caching_is_never_scored_nor_thinned(make, claude):
    gw = make(FINE)
    engine = with_engine(gw)
    cached = "Reference notes, cached:\n\n" + "\n\n".join(
        f"Archive note {i}: the records of the town were kept in the old hall." for i in range(40))
    with aclient(gw) as c:
        c.messages.create(model="claude", max_tokens=16, messages=[{"role": "user", "content": [
            {"type": "text", "text": cached, "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": PROMPT}]}])
    first, second = claude.records[-1].json["messages"][0]["content"]
    assert first == {"type": "text", "text": cached, "cache_control": {"type": "ephemeral"}}
    assert second["text"].endswith("\n\n" + QUESTION)
    assert gw.logged(1)[0]["compress_fine"] == "applied"
    assert scored_texts(engine) and not any("Archive" in t for t in scored_texts(engine))


# -- the Responses API ---------------------------------------------------------------------

def test_a_responses_request_is_cut_translated_and_natively(make, fake, fake_server):
    gw = make(more=f"""
[upstreams.native]
type = "openai"
forward_headers = ["x-fake-*"]
base_url = "{fake_server.url}/v1"
native_responses = true

[models.native]
targets = [{{ upstream = "native", model = "native-model" }}]
""")
    tool_docs = "\n\n".join(DOCS)
    with oclient(gw) as c:
        c.responses.create(model="fake-model", input=PROMPT)
        c.responses.create(model="native", instructions="Answer briefly.", input=[
            {"role": "user", "content": [{"type": "input_text", "text": PROMPT}]}])
        c.responses.create(model="native", input=[
            {"role": "user", "content": "How many people live in Zanzibar Falls?"},
            {"type": "function_call", "call_id": "c1", "name": "search", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": tool_docs}])
    translated, native, tool = (r.json for r in fake.records[-3:])
    assert_compressed_retrieval_prompt(translated["messages"][0]["content"])
    assert native["instructions"] == "Answer briefly."
    assert_compressed_retrieval_prompt(native["input"][0]["content"][0]["text"])
    assert tool["input"][:2] == [
        {"role": "user", "content": "How many people live in Zanzibar Falls?"},
        {"type": "function_call", "call_id": "c1", "name": "search", "arguments": "{}"}]
    result = tool["input"][2]["output"]
    assert GOLD in result and len(result) < len(tool_docs) / 2.5
    assert [r["compress_skip"] for r in gw.logged(3)] == [None, None, None]
