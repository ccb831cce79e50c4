"""The issue-47 workload's requests before their arrival times (bench/workload_mix.py, whose
docstring states the choices): chat groups (MT-Bench, Vicuna, QQP pairs), NQ retrieval
prompts, τ-bench conversations turn by turn, each body as the client sends it, and their
input tokens as the provider simulator counts them (o200k_base through
gateway.testing.cache_sim). Pure: reads ``../shared/data``."""

from __future__ import annotations

import hashlib
import itertools
import random
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from gateway.formats.openai_to_anthropic import anthropic_request
from gateway.testing.cache_sim import Tokenizer, anthropic_prefix, openai_prompt

if __package__ == "bench":  # imported as bench.workload_sources (tests, python -m)
    from bench.agent_traces import load as load_traces
    from bench.compression_data import POSITIONS, nq_items
else:  # bench/ itself on sys.path (python bench/workload.py)
    from agent_traces import load as load_traces
    from compression_data import POSITIONS, nq_items

if TYPE_CHECKING:
    from bench.workload_mix import MixParams

__all__ = ["DATA", "ChatGroup", "Conversation", "Draft", "chat_drafts", "chat_population",
           "conversations", "input_tokens", "retrieval_drafts"]

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
INSTRUCTION = ("Write a high-quality answer for the given question using only the provided "
               "search results (some of which might be irrelevant).")  # lost-in-the-middle's
_TOKENIZER = Tokenizer()
_nq_items = cache(nq_items)  # its distractor draw is the slow part; items are frozen


@dataclass(frozen=True)
class ChatGroup:
    """A chat question: ``id`` (the ``group`` of its requests), its wordings (two for a QQP
    duplicate pair, else one), ``source``: "mt_bench", "vicuna", "qqp_duplicate",
    "qqp_near_miss"."""

    id: str
    texts: tuple[str, ...]
    source: str


@dataclass
class Draft:
    """A request before its arrival time; ``tokens``: its input (0: not counted yet)."""

    kind: str
    api: str
    body: dict[str, Any]
    tokens: int
    conversation: str | None = None
    turn: int = 0
    group: str | None = None
    answers: tuple[str, ...] = ()


def _rows(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def _short(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:10]


def _words(text: str) -> set[str]:
    return set("".join(c if c.isalnum() else " " for c in text.lower()).split())


@cache
def _qqp(split: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """QQP pairs (duplicates, look-alike non-duplicates), each text in one pair only."""
    seen: set[str] = set()
    same, near = [], []
    for row in _rows(DATA / "semantic_cache" / f"qqp_pairs_{split}.jsonl"):
        a, b = row["text_a"].strip(), row["text_b"].strip()
        keys = {a.lower(), b.lower()}
        if len(keys) < 2 or keys & seen or min(len(a), len(b)) < 12:
            continue
        seen |= keys
        if row["label"] == 1:
            same.append((a, b))
        elif len(_words(a) & _words(b)) * 2 >= len(_words(a) | _words(b)):
            near.append((a, b))
    return same, near


def chat_population(params: MixParams) -> list[ChatGroup]:
    """The chat groups in popularity order (rank 1 first)."""
    groups = [ChatGroup(f"mt_bench-{r['question_id']}", (r["turns"][0],), "mt_bench")
              for r in _rows(DATA / "prompts" / "mt_bench_questions.jsonl")]
    groups += [ChatGroup(f"vicuna-{r['question_id']}", (r["turns"][0],), "vicuna")
               for r in _rows(DATA / "prompts" / "vicuna_bench_questions.jsonl")]
    same, near = _qqp(params.split)
    rng = random.Random(f"{params.seed}/qqp")
    for a, b in rng.sample(same, params.paraphrase_pairs):
        groups.append(ChatGroup(f"qqp-{_short(a)}", (a, b), "qqp_duplicate"))
    for pair in rng.sample(near, params.near_miss_pairs):
        groups += [ChatGroup(f"qqp-{_short(t)}", (t,), "qqp_near_miss") for t in pair]
    random.Random(f"{params.seed}/ranks").shuffle(groups)
    return groups


def _openai_body(messages: list[dict[str, Any]], params: MixParams, kind: str,
                 **extra: Any) -> dict[str, Any]:
    return {"model": params.openai_model, "messages": messages, **extra,
            "max_tokens": params.max_tokens(kind), "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}


def _as(api: str, body: dict[str, Any], params: MixParams) -> dict[str, Any]:
    if api == "openai":
        return body
    return anthropic_request(body, params.anthropic_model, body["max_tokens"])


def chat_drafts(params: MixParams, count: int) -> list[Draft]:
    groups = chat_population(params)
    weights = list(itertools.accumulate((r + 1) ** -params.zipf_s for r in range(len(groups))))
    rng = random.Random(f"{params.seed}/chat")
    visits: Counter[str] = Counter()
    out = []
    for group in rng.choices(groups, cum_weights=weights, k=count):
        seen = visits[group.id]
        visits[group.id] += 1
        text = group.texts[seen] if seen < len(group.texts) else rng.choice(group.texts)
        api = "anthropic" if rng.random() < params.chat_anthropic_share else "openai"
        body = _as(api, _openai_body([{"role": "user", "content": text}], params, "chat"),
                   params)
        out.append(Draft("chat", api, body, 0, group=group.id))
    return out


def retrieval_drafts(params: MixParams, count: int) -> list[Draft]:
    items = _nq_items(params.split == "dev", max(100, 2 * count))
    if count > len(items):
        raise ValueError(f"{count} retrieval requests: only {len(items)} NQ items")
    rng = random.Random(f"{params.seed}/retrieval")
    out = []
    for item in rng.sample(items, count):
        prompt = (f"{INSTRUCTION}\n\n{item.context(rng.choice(POSITIONS))}\n\n"
                  f"Question: {item.question}\nAnswer:")
        body = _openai_body([{"role": "user", "content": prompt}], params, "retrieval")
        out.append(Draft("retrieval", "openai", body, 0, answers=item.answers))
    return out


@dataclass
class Conversation:
    """A recorded conversation: each assistant turn's offset (s from the first turn) and
    history; its requests are built for an API on first use."""

    id: str
    offsets: list[float]
    histories: list[list[dict[str, Any]]]
    tools: list[dict[str, Any]]
    built: dict[str, list[Draft]]

    def turns(self, api: str, params: MixParams) -> list[Draft]:
        if api not in self.built:
            self.built[api] = [
                Draft("agent", api, _as(api, _openai_body(history, params, "agent",
                                                           tools=self.tools), params), 0,
                       conversation=self.id, turn=j)
                for j, history in enumerate(self.histories)]
        return self.built[api]


def conversations(params: MixParams) -> list[Conversation]:
    """The split's conversations in a seeded order, with their turns' offsets: after tool
    results ``tool_gap_s`` + Exp(``tool_gap_extra_s``), after a user message ``user_gap_s`` +
    Exp(``user_gap_extra_s``)."""
    conversations, tools = load_traces(params.split)
    order = list(range(len(conversations)))
    random.Random(f"{params.seed}/conversations").shuffle(order)
    out = []
    for c in order:
        messages, cid = conversations[c], f"tau-{params.split}-{c:03d}"
        rng = random.Random(f"{params.seed}/gaps/{cid}")
        offsets, histories, at, last = [], [], 0.0, 0
        for j, k in enumerate(i for i, m in enumerate(messages) if m["role"] == "assistant"):
            if j:
                user = any(m["role"] == "user" for m in messages[last + 1:k])
                base, extra = ((params.user_gap_s, params.user_gap_extra_s) if user
                               else (params.tool_gap_s, params.tool_gap_extra_s))
                at += base + (rng.expovariate(1 / extra) if extra > 0 else 0.0)
            last = k
            offsets.append(at)
            histories.append(messages[:k])
        out.append(Conversation(cid, offsets, histories, tools, {}))
    return out


def input_tokens(api: str, body: dict[str, Any]) -> int:
    """A request's input tokens as the provider simulator counts them (o200k_base)."""
    if api == "anthropic":
        blocks = anthropic_prefix(body, _TOKENIZER)
        return blocks[-1].end if blocks else 0
    return len(openai_prompt(body, _TOKENIZER)) // 4
