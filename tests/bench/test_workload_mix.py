"""The issue-47 workload (bench/workload_mix.py) is what the bench says it sends: the same
seed gives the same stream, the kinds and the chat popularity come in the stated shares, an
agent conversation's turns come in order with a growing history, both APIs carry valid
requests, and a paraphrase is a wording Quora's labellers called the same question."""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from typing import Any

import orjson
import pytest

from bench.compression_data import normalize
from bench.workload_mix import (
    DATA,
    KINDS,
    MixParams,
    WorkRequest,
    build,
    chat_population,
    offered_load,
    summary,
)
from gateway.testing.anthropic_rules import validate_request

pytestmark = pytest.mark.skipif(not DATA.exists(), reason="../shared/data is not here")

SMALL = MixParams(n=150, warmup=20)
CLOCK = "The current time is 2024-05-15 15:00:00 EST."


@pytest.fixture(scope="module")
def mix() -> list[WorkRequest]:
    return build(MixParams())


def test_the_same_seed_gives_the_same_stream() -> None:
    first, again = build(SMALL), build(SMALL)
    assert first == again
    other = build(MixParams(n=150, warmup=20, seed=SMALL.seed + 1))
    assert [r.body for r in other] != [r.body for r in first]


def test_kinds_warmup_and_load_come_as_stated(mix: list[WorkRequest]) -> None:
    params = MixParams()
    assert len(mix) == params.n + params.warmup
    assert [r.warmup for r in mix] == [True] * params.warmup + [False] * params.n
    assert [r.t_s for r in mix] == sorted(r.t_s for r in mix)
    assert len({r.id for r in mix}) == len(mix)
    counts = Counter(r.kind for r in mix)
    assert counts == {"agent": 315, "chat": 245, "retrieval": 140}  # 45/35/20 of 700
    measured = Counter(r.kind for r in mix if not r.warmup)
    for kind in KINDS:
        assert abs(measured[kind] / params.n - getattr(params, f"{kind}_share")) < 0.03
    load = offered_load(mix, params)
    assert load["by_model"]["gpt-4o"]["fraction"] == pytest.approx(params.load, abs=0.01)
    assert load["by_model"]["claude-sonnet-4-5"]["fraction"] < params.load
    for r in mix:
        assert r.body["max_tokens"] == {"agent": 256, "chat": 512, "retrieval": 64}[r.kind]
        assert r.body["temperature"] == 0


def test_chat_popularity_follows_zipf() -> None:
    params = MixParams(n=4000, warmup=0, agent_share=0, chat_share=1, retrieval_share=0)
    rank = {g.id: r for r, g in enumerate(chat_population(params), 1)}
    seen = Counter(rank[str(r.group)] for r in build(params))
    weights = [r ** -params.zipf_s for r in range(1, len(rank) + 1)]
    for r in range(1, 11):  # the head: each rank within 4 standard deviations
        p = weights[r - 1] / sum(weights)
        assert abs(seen[r] - params.n * p) < 4 * math.sqrt(params.n * p * (1 - p))
    xs = [math.log(r) for r in range(1, 41)]  # the slope of log count on log rank
    ys = [math.log(seen[r] or 0.5) for r in range(1, 41)]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = (sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
             / sum((x - mx) ** 2 for x in xs))
    assert slope == pytest.approx(-params.zipf_s, abs=0.15)


def _messages(r: WorkRequest) -> list[dict[str, Any]]:
    return list(r.body["messages"])


def test_a_conversations_turns_come_in_order_with_a_growing_history(
        mix: list[WorkRequest]) -> None:
    conversations: dict[str, list[WorkRequest]] = defaultdict(list)
    for r in mix:
        if r.kind == "agent":
            conversations[str(r.conversation)].append(r)
    assert len(conversations) >= 30
    apis = Counter(turns[0].api for turns in conversations.values())
    assert apis["openai"] > 10 and apis["anthropic"] > 10
    for turns in conversations.values():
        assert len({(r.api, r.model) for r in turns}) == 1
        for before, after in itertools.pairwise(turns):
            assert after.turn == before.turn + 1
            assert after.t_s - before.t_s >= MixParams().tool_gap_s - 1e-3
            old, new = _messages(before), _messages(after)
            assert new[:len(old)] == old and len(new) > len(old)
        for r in turns:
            system = r.body["system"] if r.api == "anthropic" else r.body["messages"][0]["content"]
            assert CLOCK in system  # as recorded, never moved
            assert len(r.body["tools"]) == 14


def test_both_apis_carry_valid_streamed_requests(mix: list[WorkRequest]) -> None:
    by = Counter((r.kind, r.api) for r in mix)
    assert by[("agent", "openai")] and by[("agent", "anthropic")]
    assert by[("chat", "openai")] and by[("chat", "anthropic")]
    assert by[("retrieval", "openai")] == sum(r.kind == "retrieval" for r in mix)
    for r in mix:
        if r.api == "anthropic":
            validate_request(r.body)
            assert r.model == r.body["model"] == "claude-sonnet-4-5"
            assert r.body["stream"] is True
            assert b"cache_control" not in orjson.dumps(r.body)  # no client markers
        else:
            assert r.model == r.body["model"] == "gpt-4o"
            assert r.body["messages"] and r.body["stream"] is True
            assert r.body["stream_options"] == {"include_usage": True}


def test_retrieval_asks_after_twenty_documents_holding_the_answer(
        mix: list[WorkRequest]) -> None:
    for r in (r for r in mix if r.kind == "retrieval"):
        prompt = r.body["messages"][-1]["content"]
        documents = [line for line in prompt.splitlines() if line.startswith("Document [")]
        assert [d[:d.index("]") + 1] for d in documents] == [f"Document [{i}]"
                                                             for i in range(1, 21)]
        assert prompt.rindex("Document [20]") < prompt.rindex("\n\nQuestion: ")
        assert prompt.endswith("\nAnswer:")
        assert any(normalize(a) in normalize(prompt) for a in r.answers)


def _qqp(label: int) -> set[frozenset[str]]:
    rows = map(orjson.loads, (DATA / "semantic_cache" / "qqp_pairs_test.jsonl").read_bytes()
               .splitlines())
    return {frozenset((r["text_a"].strip(), r["text_b"].strip())) for r in rows
            if r["label"] == label}


def test_paraphrases_are_pairs_labelled_duplicates(mix: list[WorkRequest]) -> None:
    params = MixParams()
    population = chat_population(params)
    pairs = [g for g in population if len(g.texts) == 2]
    assert len(pairs) == params.paraphrase_pairs
    assert {frozenset(g.texts) for g in pairs} <= _qqp(1)
    near = {g.texts[0] for g in population if g.source == "qqp_near_miss"}
    assert len(near) == 2 * params.near_miss_pairs
    assert len([p for p in _qqp(0) if p <= near]) == params.near_miss_pairs
    texts = {g.id: g.texts for g in population}
    wordings: dict[str, set[str]] = defaultdict(set)
    for r in (r for r in mix if r.kind == "chat"):
        assert r.body["messages"][-1]["content"] in texts[str(r.group)]
        wordings[str(r.group)].add(r.body["messages"][-1]["content"])
    assert sum(len(w) == 2 for w in wordings.values()) >= 10


def test_summary_reports_the_mix(mix: list[WorkRequest]) -> None:
    s = summary(mix)
    assert s["measured"] == 600 and s["warmup"] == 100
    assert sum(s["by_kind"].values()) == sum(s["by_kind_api"].values()) == 600
    assert s["distinct_prompts"] < 600  # chat repeats
    assert 0.2 < s["chat"]["repeat_share"] < 0.5
    assert 0.03 < s["chat"]["paraphrase_share"] < 0.2
    assert s["load"]["mean_input_tokens"]["agent"] > 3000
    assert s["load"]["mean_input_tokens"]["retrieval"] > 1500


def test_params_round_trip_and_refuse_what_they_do_not_know() -> None:
    assert MixParams.from_dict(MixParams().to_dict()) == MixParams()
    with pytest.raises(ValueError, match="unknown"):
        MixParams.from_dict({"requests": 5})
    with pytest.raises(ValueError, match="sum to 1"):
        build(MixParams(agent_share=0.5, chat_share=0.5, retrieval_share=0.5))
