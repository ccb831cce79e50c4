"""The issue-47 workload: a seeded stream of streamed requests mixing agent turns, chat and
retrieval, with Poisson arrivals near a provider's token-per-minute limit. Pure: it reads
``../shared/data`` and nothing else; the same :class:`MixParams` give the same list.

    build(params)          -> list[WorkRequest], in arrival order (the first ``warmup`` flagged)
    summary(requests)      -> dict: counts, repeats and paraphrases, mean input tokens
    offered_load(requests, params) -> dict: input tokens per request (by kind) and per minute
                              (by model, input alone and input + max_tokens, share of the limit)
    python bench/workload_mix.py ['{"tpm_limit": 450000}']   prints the three

Kinds, shares of all requests (default 45 / 35 / 20, the issue's mix: agent turns carry most
of the tokens, chat most of the repeats, retrieval long one-off prompts):

- agent: τ-bench airline conversations (test split; bench/agent_traces.py), one request per
  assistant turn with the recorded history so far and the 14 tools, temperature 0 (τ-bench's
  run.py default), the system prompt as recorded (its "The current time is ..." line is the
  same in every request). A conversation's turns come in order, each after the previous one
  by ``tool_gap_s`` + Exp(``tool_gap_extra_s``) when tool results came between, else
  ``user_gap_s`` + Exp(``user_gap_extra_s``) (the traces' user is an LLM, as in τ-bench; a
  gap covers the previous answer's stream too: a runner should still hold a turn until its
  previous turn has ended). ``agent_anthropic_share`` of the conversations (half) are
  Anthropic Messages (gateway.formats.openai_to_anthropic), without cache markers.
- chat: one-question chats, temperature 0, over groups ranked by a seeded shuffle and drawn
  with Zipf popularity (P(rank r) ~ r^-zipf_s; 0.8, the top of the 0.64-0.83 Breslau et al.
  measured for web requests, INFOCOM 1999). Groups: the first turns of MT-Bench and Vicuna
  (160, one wording each: their repeats are exact); ``paraphrase_pairs`` Quora Question Pairs
  labelled duplicates (test split; a group of two wordings: the second visit asks the other
  one, later visits either); ``near_miss_pairs`` QQP pairs labelled *not* duplicates whose
  word sets overlap by half or more (two groups: a cache matching on similarity alone serves
  one's answer to the other). ``group`` names the meaning: a cached answer is right only for
  a request of the same group (QQP's labels are human and noisy). ``chat_anthropic_share``
  (a quarter, drawn per request) go as Anthropic Messages: enough to exercise both caches.
- retrieval: NQ-open with 20 documents (bench/compression_data.py, test half), the gold
  passage at 1, 5, 10, 15 or 20, lost-in-the-middle's QA prompt (instruction, documents,
  then the question), temperature 0 (their greedy decoding), OpenAI only; ``answers`` holds
  the gold answers (a compressed prompt must keep one).

Arrivals: chat and retrieval are Poisson processes; conversations start as a Poisson process
already running at time 0 (stationary: the conversations under way contribute their later
turns). The span is solved so that the busiest model's offered input tokens per minute over
the measured requests are ``load`` x ``tpm_limit`` (0.7 of 2M: near the limit, with room for
Poisson bursts). The warm-up (100 requests, a few seconds) warms caches and connections and
holds the first turn of nearly every conversation under way at 0. Token counts: o200k_base
through gateway.testing.cache_sim's Tokenizer, over what the provider simulator counts
(cache_sim.openai_prompt, cache_sim.anthropic_prefix), for both APIs (Claude's tokenizer
counts more: an approximation). Bodies share messages and tools: read-only.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
from collections import Counter
from dataclasses import dataclass
from typing import Any

import orjson

if __package__ == "bench":  # imported as bench.workload_mix (tests, python -m)
    from bench import workload_sources as sources
else:  # bench/ itself on sys.path (python bench/workload.py)
    import workload_sources as sources

__all__ = ["DATA", "KINDS", "ChatGroup", "MixParams", "WorkRequest", "build", "chat_population",
           "input_tokens", "offered_load", "summary"]

KINDS = ("agent", "chat", "retrieval")
DATA = sources.DATA
ChatGroup = sources.ChatGroup
chat_population = sources.chat_population


@dataclass(frozen=True)
class WorkRequest:
    """One client request. ``t_s``: arrival (s from the stream's start); ``api``: "openai"
    (POST /v1/chat/completions) or "anthropic" (POST /v1/messages); ``body``: what the client
    sends, streamed (OpenAI bodies ask ``stream_options.include_usage``); ``turn``: the
    assistant turn's index in its ``conversation`` (agent), else 0; ``group``: a chat
    question's meaning (paraphrases share it); ``answers``: retrieval's gold answers."""

    id: str
    t_s: float
    api: str
    model: str
    body: dict[str, Any]
    kind: str
    conversation: str | None
    turn: int
    group: str | None
    warmup: bool
    answers: tuple[str, ...] = ()


@dataclass(frozen=True)
class MixParams:
    """The workload's knobs (module docstring for the reasons behind the defaults)."""

    n: int = 600  # measured requests
    warmup: int = 100  # requests before them in the same stream, flagged (module docstring)
    seed: int = 47
    agent_share: float = 0.45  # shares of all requests (warm-up included), summing to 1
    chat_share: float = 0.35
    retrieval_share: float = 0.20
    tpm_limit: int = 2_000_000  # tokens/min per model and key (OpenAI gpt-4o, tier 4):
    # pass the simulator's own limit here
    load: float = 0.7  # the busiest model's offered input tokens/min over tpm_limit
    openai_model: str = "gpt-4o"
    anthropic_model: str = "claude-sonnet-4-5"
    agent_anthropic_share: float = 0.5  # of conversations
    chat_anthropic_share: float = 0.25  # of chat requests
    zipf_s: float = 0.8  # chat popularity exponent
    paraphrase_pairs: int = 160  # QQP duplicate pairs among the chat groups
    near_miss_pairs: int = 20  # QQP non-duplicate look-alike pairs (two groups each)
    agent_max_tokens: int = 256
    chat_max_tokens: int = 512
    retrieval_max_tokens: int = 64
    tool_gap_s: float = 2.5  # s from a turn to the next one after tool results (minimum)
    tool_gap_extra_s: float = 0.5  # s, mean of the exponential part
    user_gap_s: float = 4.0  # s from a turn to the next one after a user message (minimum)
    user_gap_extra_s: float = 2.0  # s, mean of the exponential part
    split: str = "test"  # the data's held-out half (README of ../shared/data)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MixParams:
        """Raises ValueError for a key that is not a field."""
        unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown workload parameters: {sorted(unknown)}")
        return cls(**data)

    def max_tokens(self, kind: str) -> int:
        return int(getattr(self, f"{kind}_max_tokens"))


def input_tokens(request: WorkRequest) -> int:
    """A request's input tokens as the provider simulator counts them (o200k_base)."""
    return sources.input_tokens(request.api, request.body)


# -- arrivals --------------------------------------------------------------------------------

def _counts(params: MixParams) -> dict[str, int]:
    """Requests per kind over n + warmup, by largest remainder."""
    total = params.n + params.warmup
    shares = {k: getattr(params, f"{k}_share") for k in KINDS}
    if min(shares.values()) < 0 or abs(sum(shares.values()) - 1) > 1e-9:
        raise ValueError(f"kind shares must be >= 0 and sum to 1: {shares}")
    counts = {k: math.floor(total * s) for k, s in shares.items()}
    by_rest = sorted(KINDS, key=lambda k: (-(total * shares[k] - counts[k]), KINDS.index(k)))
    for k in by_rest[:total - sum(counts.values())]:
        counts[k] += 1
    return counts


def _poisson(seed: str, count: int, span_s: float) -> list[float]:
    rng = random.Random(seed)
    return list(itertools.accumulate(rng.expovariate(1.0) * span_s / count
                                     for _ in range(count)))


class _Agents:
    """Conversations laid out on the time line for a span: a stationary stream (a renewal
    process's start: the conversations under way at 0, as many as the start rate x the mean
    duration, drawn in proportion to their duration, each at a uniform age; then new ones
    starting as a Poisson process). Every draw is made once, whatever the span, so that the
    stream changes little with it. A conversation's API is fixed by its place in the seeded
    order: Anthropic when floor(k x agent_anthropic_share) steps up."""

    def __init__(self, params: MixParams) -> None:
        self.params = params
        self.pool = sources.conversations(params) if params.agent_share > 0 else []
        share = params.agent_anthropic_share
        self.api = ["anthropic" if math.floor((k + 1) * share) > math.floor(k * share)
                    else "openai" for k in range(len(self.pool))]
        durations = [c.offsets[-1] for c in self.pool]
        self.mean_turns = sum(len(c.offsets) for c in self.pool) / max(len(self.pool), 1)
        self.mean_duration = sum(durations) / max(len(self.pool), 1)
        rng = random.Random(f"{params.seed}/under-way")
        left, self.under_way = list(range(len(self.pool))), []  # (age share, conversation)
        while any(durations[j] for j in left):
            i = rng.choices(left, weights=[durations[j] for j in left])[0]
            left.remove(i)
            self.under_way.append((rng.random(), i))
        rng = random.Random(f"{params.seed}/starts")
        self.gaps = [rng.expovariate(1.0) for _ in self.pool]  # starts at rate 1

    def schedule(self, count: int, span_s: float) -> list[tuple[float, sources.Draft]]:
        """The first ``count`` turns at or after 0, at a turn rate of count / span_s."""
        if count == 0:
            return []
        rate = count / span_s / self.mean_turns  # conversation starts per s
        k = round(rate * self.mean_duration)
        if k > len(self.under_way):
            raise ValueError("not enough conversations under way for this rate")
        busy = {i for _, i in self.under_way[:k]}
        fresh = (i for i in range(len(self.pool)) if i not in busy)
        starts = itertools.accumulate(gap / rate for gap in self.gaps)
        times: list[tuple[float, sources.Draft]] = []
        for at, i in itertools.chain(((-age * self.pool[i].offsets[-1], i)
                                      for age, i in self.under_way[:k]), zip(starts, fresh)):
            if len(times) >= count and at > times[count - 1][0]:
                return times[:count]
            turns = self.pool[i].turns(self.api[i], self.params)
            times = sorted(times + [(at + g, d) for g, d in zip(self.pool[i].offsets, turns,
                                                                strict=True) if at + g >= 0],
                           key=lambda x: x[0])
        raise ValueError(f"not enough {self.params.split} conversations for this mix: lower "
                         f"n, the agent share or the load")


def _tokens(draft: sources.Draft) -> int:
    if not draft.tokens:
        draft.tokens = sources.input_tokens(draft.api, draft.body)
    return draft.tokens


def _layout(params: MixParams, drafts: dict[str, list[sources.Draft]], agents: _Agents,
            count: int, span_s: float) -> list[tuple[float, sources.Draft]]:
    timed = [*agents.schedule(count, span_s)]
    for kind in ("chat", "retrieval"):
        if drafts[kind]:
            times = _poisson(f"{params.seed}/arrivals/{kind}", len(drafts[kind]), span_s)
            timed += zip(times, drafts[kind], strict=True)
    return sorted(timed, key=lambda x: x[0])


def _tpm(timed: list[tuple[float, sources.Draft]], warmup: int) -> float:
    """The busiest model's input tokens per minute over the measured requests."""
    measured = timed[warmup:]
    span = max(measured[-1][0] - measured[0][0], 1e-9)
    by_model: Counter[str] = Counter()
    for _, draft in measured:
        by_model[draft.body["model"]] += _tokens(draft)
    return max(by_model.values()) * 60 / span


def build(params: MixParams | None = None) -> list[WorkRequest]:
    """The workload, in arrival order (module docstring). Raises ValueError for shares that
    do not sum to 1, or a mix the data cannot fill."""
    params = params or MixParams()
    counts = _counts(params)
    drafts = {"chat": sources.chat_drafts(params, counts["chat"]),
              "retrieval": sources.retrieval_drafts(params, counts["retrieval"])}
    agents = _Agents(params)
    target = params.load * params.tpm_limit
    tried: list[tuple[float, float, list[tuple[float, sources.Draft]]]] = []  # (miss, span, timed)

    def attempt(span_s: float) -> float:
        timed = _layout(params, drafts, agents, counts["agent"], span_s)
        tpm = _tpm(timed, params.warmup)
        tried.append((abs(tpm / target - 1), span_s, timed))
        return tpm

    span_s = 60.0
    for _ in range(8):  # offered tokens/min ~ 1/span: a fixed point
        span_s *= attempt(span_s) / target
    near = min(tried, key=lambda x: x[0])[1]
    for k in range(-12, 13):  # the stream changes in steps (a conversation more or less)
        attempt(near * (1 + k / 400))
    best = min(tried, key=lambda x: (x[0], x[1]))[2]
    t0 = best[0][0]
    return [WorkRequest(id=f"{i:04d}-{d.kind}", t_s=round(t - t0, 4), api=d.api,
                        model=d.body["model"], body=d.body, kind=d.kind,
                        conversation=d.conversation, turn=d.turn, group=d.group,
                        warmup=i < params.warmup, answers=d.answers)
            for i, (t, d) in enumerate(best)]


# -- reports ---------------------------------------------------------------------------------

def offered_load(requests: list[WorkRequest], params: MixParams | None = None
                 ) -> dict[str, Any]:
    """Estimated input tokens per request (mean by kind, o200k_base) and the offered tokens
    per minute by model over the measured requests: input alone, and input + max_tokens (what
    OpenAI's limiter counts at admission); ``fraction``: of ``params.tpm_limit``."""
    measured = [r for r in requests if not r.warmup]
    span_s = measured[-1].t_s - measured[0].t_s if len(measured) > 1 else 0.0
    tokens = {r.id: input_tokens(r) for r in requests}
    per_min = 60 / span_s if span_s else 0.0
    models = sorted({r.model for r in measured})
    by_model: dict[str, dict[str, float]] = {}
    for m in models:
        mine = [r for r in measured if r.model == m]
        by_model[m] = {"input_tpm": round(sum(tokens[r.id] for r in mine) * per_min),
                       "input_plus_max_tokens_tpm": round(sum(
                           tokens[r.id] + int(r.body["max_tokens"]) for r in mine) * per_min)}
    out: dict[str, Any] = {
        "measured_span_s": round(span_s, 1),
        "requests_per_s": round((len(measured) - 1) / span_s, 2) if span_s else 0.0,
        "mean_input_tokens": {k: round(sum(tokens[r.id] for r in group) / len(group))
                              for k in KINDS if (group := [r for r in requests if r.kind == k])},
        "by_model": by_model,
        "tokenizer": "o200k_base (gateway.testing.cache_sim.Tokenizer) for both APIs",
    }
    if params is not None:
        out["tpm_limit"] = params.tpm_limit
        for m in models:
            by_model[m]["fraction"] = round(by_model[m]["input_tpm"] / params.tpm_limit, 3)
    return out


def _prompt_key(request: WorkRequest) -> bytes:
    return orjson.dumps(request.body, option=orjson.OPT_SORT_KEYS)


def summary(requests: list[WorkRequest]) -> dict[str, Any]:
    """Counts (measured requests) by kind, API and model; distinct prompts; chat repeats
    (the same model and text asked before, warm-up included) and paraphrases (the same
    model and group asked before, never this text) as shares of measured chat requests;
    agent conversations; the input-token estimates (:func:`offered_load`)."""
    measured = [r for r in requests if not r.warmup]
    n = len(measured) or 1
    texts: set[tuple[str, str]] = set()
    groups: set[tuple[str, str | None]] = set()
    chat: Counter[str] = Counter()
    for r in requests:
        if r.kind != "chat":
            continue
        text = json.dumps(r.body["messages"])
        key = "repeat" if (r.model, text) in texts else (
            "paraphrase" if (r.model, r.group) in groups else "first")
        if not r.warmup:
            chat[key] += 1
        texts.add((r.model, text))
        groups.add((r.model, r.group))
    seen: set[str] = set()
    entered_mid = 0
    for r in requests:
        if r.kind == "agent" and r.conversation not in seen:
            seen.add(str(r.conversation))
            entered_mid += (not r.warmup) and r.turn > 0
    agent = [r for r in measured if r.kind == "agent"]
    chats = sum(chat.values()) or 1
    top = Counter(r.group for r in measured if r.kind == "chat").most_common(1)
    return {
        "requests": len(requests), "warmup": len(requests) - len(measured),
        "measured": len(measured),
        "by_kind": {k: sum(r.kind == k for r in measured) for k in KINDS},
        "share": {k: round(sum(r.kind == k for r in measured) / n, 3) for k in KINDS},
        "by_kind_api": dict(sorted(Counter(f"{r.kind}/{r.api}" for r in measured).items())),
        "by_model": dict(sorted(Counter(r.model for r in measured).items())),
        "distinct_prompts": len({_prompt_key(r) for r in measured}),
        "chat": {"requests": sum(chat.values()),
                 "groups": len({r.group for r in measured if r.kind == "chat"}),
                 "repeat_share": round(chat["repeat"] / chats, 3),
                 "paraphrase_share": round(chat["paraphrase"] / chats, 3),
                 "top_group_share": round(top[0][1] / chats, 3) if top else 0.0},
        "agent": {"conversations": len({r.conversation for r in agent}),
                  "turns_per_conversation": round(
                      len(agent) / (len({r.conversation for r in agent}) or 1), 1),
                  "measured_entering_mid_conversation": entered_mid},
        "load": offered_load(requests),
    }


if __name__ == "__main__":  # python bench/workload_mix.py ['{"tpm_limit": 450000}']
    import sys

    chosen = MixParams.from_dict(json.loads(sys.argv[1]) if len(sys.argv) > 1 else {})
    built = build(chosen)
    print(json.dumps({"params": chosen.to_dict(), "summary": summary(built),
                      "load": offered_load(built, chosen)}, indent=1))
