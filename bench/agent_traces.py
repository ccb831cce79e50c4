"""The τ-bench airline conversations as a prompt-caching workload, and the most a provider's
cache could save on it.

Data: ``../shared/data/agent_traces/`` (OpenAI chat format with tool calls; the 14 tools in
tau_airline_tools.json). A request per assistant turn carries the history so far and the
tools. Simulated time: conversation c starts at ``c x stagger_s``, its turn j comes
``j x turn_s`` later; requests are replayed in that order.

Variants: ``recorded`` (as the data has them: the system prompt's "The current time is ..."
line is the same in every request) and ``volatile`` (that time is the request's own simulated
time, and the tools come in a different order on every request, as MCP clients send them).

Setups: ``none`` (the client marks nothing) and ``markers`` (LiteLLM-style fixed markers: the
client marks the system prompt and the last message with ``cache_control``; Anthropic only,
OpenAI has no markers). Anthropic bodies are the OpenAI request converted by
:func:`gateway.formats.openai_to_anthropic.anthropic_request`: the client speaks /v1/messages.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from gateway.formats.openai_to_anthropic import anthropic_request
from gateway.testing.cache_sim import (
    Tokenizer,
    anthropic_min_tokens,
    anthropic_prefix,
    openai_prompt,
)

__all__ = ["DATA", "Reuse", "Turn", "anthropic_body", "load", "max_cached", "openai_body",
           "schedule"]

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "agent_traces"
#: The recorded system prompt's time line, and the time it names.
TIME_LINE = re.compile(r"(The current time is )\d{4}-\d\d-\d\d \d\d:\d\d:\d\d EST\.")
START = datetime(2024, 5, 15, 15, 0, 0)
MARK = {"type": "ephemeral"}


@dataclass(frozen=True)
class Turn:
    """One request: conversation ``conversation``'s ``index``-th assistant turn, sent at
    ``at`` (simulated seconds) with ``messages``, the history so far (OpenAI format)."""

    conversation: int
    index: int
    at: float
    messages: list[dict[str, Any]]


def load(split: str = "test", limit: int | None = None,
         data: Path = DATA) -> tuple[list[list[dict[str, Any]]], list[dict[str, Any]]]:
    """The conversations' messages (the first ``limit``) and the tools."""
    rows = [orjson.loads(line) for line in
            (data / f"tau_airline_{split}.jsonl").read_bytes().splitlines() if line.strip()]
    tools = orjson.loads((data / "tau_airline_tools.json").read_bytes())
    return [row["messages"] for row in rows[:limit]], tools


def schedule(conversations: list[list[dict[str, Any]]], turn_s: float,
             stagger_s: float) -> list[Turn]:
    """Every assistant turn as a request, in simulated-time order."""
    turns = []
    for c, messages in enumerate(conversations):
        at = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
        turns += [Turn(c, j, c * stagger_s + j * turn_s, messages[:k]) for j, k in enumerate(at)]
    return sorted(turns, key=lambda t: (t.at, t.conversation))


def _volatile(turn: Turn, tools: list[dict[str, Any]], time_format: str
              ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The turn's messages with its own time in the system prompt, and the tools shuffled
    (the same way for the same turn, whichever the API)."""
    now = (START + timedelta(seconds=turn.at)).strftime(time_format)
    system = turn.messages[0]
    text, found = TIME_LINE.subn(lambda m: m.group(1) + now + ".", system["content"])
    if not found:  # other data: the time goes first
        text = f"Current time: {now}\n\n{text}"
    shuffled = list(tools)
    random.Random(f"{turn.conversation}/{turn.index}").shuffle(shuffled)
    return [{**system, "content": text}, *turn.messages[1:]], shuffled


def openai_body(turn: Turn, tools: list[dict[str, Any]], variant: str, model: str,
                max_tokens: int, time_format: str = "%Y-%m-%d %H:%M:%S EST") -> dict[str, Any]:
    """The Chat Completions request of a turn."""
    messages = turn.messages
    if variant == "volatile":
        messages, tools = _volatile(turn, tools, time_format)
    return {"model": model, "messages": messages, "tools": tools, "max_tokens": max_tokens}


def anthropic_body(turn: Turn, tools: list[dict[str, Any]], variant: str, setup: str,
                   model: str, max_tokens: int, time_format: str = "%Y-%m-%d %H:%M:%S EST",
                   ) -> dict[str, Any]:
    """The Messages request of a turn; ``setup`` "markers": the system prompt and the last
    message's last block carry ``cache_control``."""
    body = anthropic_request(openai_body(turn, tools, variant, model, max_tokens, time_format),
                             model, max_tokens)
    if setup == "markers":
        system = body.get("system")
        if isinstance(system, str):
            body["system"] = [{"type": "text", "text": system, "cache_control": MARK}]
        last = body["messages"][-1]
        content = last["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        body["messages"][-1] = {**last, "content": [*blocks[:-1],
                                                    {**blocks[-1], "cache_control": MARK}]}
    return body


@dataclass
class Reuse:
    """Input tokens: ``total``, and the most a cache could have read when each request may
    reuse the previous request of its conversation (``conversation``: the issue's theoretical
    maximum), or any earlier request at all with nothing expiring (``anywhere``: the static
    prefix shared across conversations too)."""

    total: int = 0
    conversation: int = 0
    anywhere: int = 0


def max_cached(turns: list[Turn], body: Callable[[Turn], dict[str, Any]], api: str,
               upstream_model: str, tokenizer: Tokenizer) -> Reuse:
    """The most a provider's cache could read over ``turns`` (:class:`Reuse`): common
    prefixes, in whole blocks for Anthropic and in 128-token steps for OpenAI, counted when
    they reach the minimum cacheable length (the upstream model's for Anthropic, 1024 for
    OpenAI)."""
    out = Reuse()
    floor = anthropic_min_tokens(upstream_model) if api == "anthropic" else 1024
    before: dict[int, set[bytes]] = {}  # conversation -> its last prompt's prefixes
    seen: set[bytes] = set()  # the prefixes of every earlier prompt
    for turn in turns:  # in time order
        prefixes, total = _prefixes(body(turn), api, tokenizer)
        out.total += total
        conversation = _reusable(prefixes, before.get(turn.conversation, set()))
        out.conversation += conversation if conversation >= floor else 0
        anywhere = _reusable(prefixes, seen)
        out.anywhere += anywhere if anywhere >= floor else 0
        before[turn.conversation] = {digest for digest, _ in prefixes}
        seen.update(before[turn.conversation])
    return out


def _reusable(prefixes: list[tuple[bytes, int]], known: set[bytes]) -> int:
    """Tokens of the longest of ``prefixes`` that is ``known``."""
    end = 0
    for digest, tokens in prefixes:
        if digest not in known:
            break
        end = tokens
    return end


def _prefixes(body: dict[str, Any], api: str, tokenizer: Tokenizer
              ) -> tuple[list[tuple[bytes, int]], int]:
    """(digest, tokens) of each prefix a cache could hold (Anthropic's block prefixes,
    OpenAI's 128-token ones), and the prompt's length (tokens)."""
    if api == "anthropic":
        blocks = anthropic_prefix(body, tokenizer)
        return [(block.digest, block.end) for block in blocks], blocks[-1].end
    prompt = openai_prompt(body, tokenizer)
    hasher, out = hashlib.blake2b(digest_size=16), []
    for k in range(128, len(prompt) // 4 + 1, 128):
        hasher.update(prompt[(k - 128) * 4:k * 4])
        out.append((hasher.copy().digest(), k))
    return out, len(prompt) // 4
