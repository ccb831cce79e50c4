"""What the simulated provider decides for one request, without I/O: its prompt-cache usage,
rate-limit admission, fault, latency and answer (:mod:`bench.provider_sim`).

State is per organisation, which the simulator takes to be the API key (real providers keep
prompt caches and rate limits per organisation): one OpenAI and one Anthropic prompt-cache
simulator (:mod:`gateway.testing.cache_sim`, OpenAI's with the overflow added here) and one
token bucket per (key, model, limit). Time is seconds from ``clock``.
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from bench.provider_sim_params import ModelSpec, SimParams
from gateway.testing.cache_sim import AnthropicCache, OpenAICache, Tokenizer

__all__ = ["Engine", "OverflowOpenAICache", "Plan", "SimError", "cost_usd", "key_id"]

_WORDS = ("the", "model", "answer", "data", "time", "system", "value", "result", "first",
          "case", "user", "point", "order", "state", "part", "level", "form", "line", "set",
          "work", "way", "year", "number", "group", "fact", "plan", "test", "rate", "cost",
          "flight", "seat", "price", "change", "book", "city", "date", "name", "list", "step")


def key_id(key: str) -> str:
    """How stats name an API key: the first 12 hex digits of its SHA-256 (never the key)."""
    return hashlib.sha256(key.encode()).hexdigest()[:12]


class SimError(Exception):
    """A refusal in the provider's format: HTTP ``status``, ``kind`` (error type), ``fault``
    (what stats record), extra response ``headers``."""

    def __init__(self, status: int, kind: str, message: str, fault: str | None = None,
                 headers: list[tuple[bytes, bytes]] | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message
        self.fault, self.headers = fault, headers or []


class OverflowOpenAICache(OpenAICache):
    """OpenAI's cache with the overflow of [oai-cache]: past ``per_min`` requests a minute for
    one routing prefix + ``prompt_cache_key``, requests spread round-robin over
    ceil(rate / per_min) machines from the home one, so fewer land on a warm machine."""

    def __init__(self, tokenizer: Tokenizer, clock: Callable[[], float], machines: int,
                 ttl_s: float, per_min: int, window_s: float = 60.0) -> None:
        super().__init__(tokenizer, clock, machines=machines, ttl_s=ttl_s)
        self.per_min, self.window_s = max(1, per_min), window_s
        self._recent: dict[bytes, deque[float]] = {}
        self._now = 0.0

    def usage(self, body: Mapping[str, Any], now: float | None = None) -> Any:
        self._now = self.clock() if now is None else now
        return super().usage(body, self._now)

    def machine_of(self, prompt: bytes, key: str | None) -> int:
        home = super().machine_of(prompt, key)
        route = prompt[:self.route_tokens * 4] + b"\0" + (key or "").encode()
        seen = self._recent.setdefault(hashlib.blake2b(route, digest_size=16).digest(), deque())
        while seen and seen[0] <= self._now - self.window_s:
            seen.popleft()
        seen.append(self._now)
        spread = math.ceil(len(seen) / self.per_min)
        if len(self._recent) > 100_000:  # forget idle prefixes
            self._recent = {k: v for k, v in self._recent.items() if v[-1] > self._now - 60}
        return (home + (len(seen) - 1) % spread) % len(self._machines)


class _Bucket:
    """A token bucket of ``limit`` per ``window_s``, refilled continuously ([ant-limits])."""

    def __init__(self, limit: int, window_s: float, now: float) -> None:
        self.limit, self.rate = limit, limit / window_s
        self.level, self.at = float(limit), now

    def wait_s(self, cost: float, now: float) -> float:
        """0 if ``cost`` fits now, else seconds until it would (a cost over the whole limit
        needs a full bucket)."""
        self.level = min(self.limit, self.level + (now - self.at) * self.rate)
        self.at = now
        need = min(cost, self.limit)
        return 0.0 if self.level >= need else (need - self.level) / self.rate

    def take(self, cost: float) -> None:
        self.level -= cost


@dataclass
class Plan:
    """One admitted request's fate. Tokens: ``input_tokens`` uncached input (OpenAI: prompt -
    cached), ``cached_tokens`` read, ``cache_write`` by TTL ("5m", "1h"); ``words`` the answer
    (one token each); ``fault``: None, "stall" or "cut"; ``pause_at``/``pause_ms``: a
    mid-stream stall after that many tokens; ``cut_at``: a cut after that many tokens."""

    model: ModelSpec
    prompt_tokens: int
    input_tokens: int
    cached_tokens: int
    cache_write: dict[str, int]
    usage_extra: dict[str, Any]
    words: list[str]
    finished: bool  # False: max_tokens cut the answer
    ttft_ms: float
    tpot_ms: float
    fault: str | None = None
    pause_at: int = -1
    pause_ms: float = 0.0
    cut_at: int = -1
    otpm_reserved: int = 0


def cost_usd(model: ModelSpec, input_tokens: int, cached_tokens: int,
             cache_write: Mapping[str, int], output_tokens: int) -> float:
    """USD billed for a request's usage at ``model``'s prices (per 1M tokens)."""
    return (input_tokens * model.input_usd + cached_tokens * model.cached_input_usd
            + cache_write.get("5m", 0) * model.cache_write_5m_usd
            + cache_write.get("1h", 0) * model.cache_write_1h_usd
            + output_tokens * model.output_usd) / 1e6


class Engine:
    """The provider's state and decisions; ``plan`` per request, ``settle`` once it ends."""

    def __init__(self, params: SimParams, clock: Callable[[], float] = time.monotonic) -> None:
        self.params, self.clock = params, clock
        self.tokenizer = Tokenizer()
        self.reset(params.seed)

    def reset(self, seed: int) -> None:
        """Clears caches, limits and the draws (seeded ``seed``)."""
        self.seed = seed
        self._seen: dict[bytes, int] = {}  # request content -> times it came
        self._openai: dict[str, OverflowOpenAICache] = {}
        self._anthropic: dict[str, AnthropicCache] = {}
        self._buckets: dict[tuple[str, str, str], _Bucket] = {}

    def plan(self, api: str, key: str, model: ModelSpec, body: dict[str, Any]) -> Plan:
        """Caches, admits and draws one request. Raises SimError: 400 (over 4 breakpoints),
        429 (a limit, with retry-after headers), 500 / 529 / 503 (injected faults)."""
        p, now = self.params, self.clock()
        max_tokens = _max_tokens(api, body)
        if api == "openai":
            cache = self._openai.get(key)
            if cache is None:
                cache = self._openai[key] = OverflowOpenAICache(
                    self.tokenizer, self.clock, p.openai_machines, p.openai_cache_ttl_s,
                    p.openai_overflow_per_min, p.limit_window_s)
            # admission needs the prompt size first (OpenAI tokenizes at admission too)
            prompt, cached, _machine = cache.usage(body, now)
            write: dict[str, int] = {}
            uncached, extra = prompt - cached, {}
            self._admit(key, model, now, requests=1, tpm=prompt + (max_tokens or p.out_max))
        else:
            sim = self._anthropic.get(key)
            if sim is None:
                sim = self._anthropic[key] = AnthropicCache(self.tokenizer, self.clock)
            try:
                usage = sim.usage(body, now)
            except ValueError as exc:  # more than 4 breakpoints
                raise SimError(400, "invalid_request_error", str(exc)) from exc
            cached = usage["cache_read_input_tokens"]
            by_ttl = usage["cache_creation"]
            write = {"5m": by_ttl["ephemeral_5m_input_tokens"],
                     "1h": by_ttl["ephemeral_1h_input_tokens"]}
            uncached = usage["input_tokens"] + usage["cache_creation_input_tokens"]
            prompt, extra = uncached + cached, usage
            self._admit(key, model, now, requests=1, itpm=uncached, otpm=max_tokens)
        rng = self._draws(body)
        roll = rng.random()
        if roll < p.fault_500:
            raise SimError(500, "api_error", "Internal server error", "500")
        if roll < p.fault_500 + p.fault_overloaded:
            if api == "anthropic":
                raise SimError(529, "overloaded_error", "Overloaded", "529")
            raise SimError(503, "server_error", "The server is overloaded or not ready yet.",
                           "503")
        words, finished = self._continued(api, model.name, body, max_tokens)
        base = p.base_ms if model.base_ms is None else model.base_ms
        ttft = ((base + p.ms_per_uncached_token * uncached + p.ms_per_cached_token * cached)
                * math.exp(rng.gauss(0.0, p.ttft_sigma)))
        if rng.random() < p.tail_share:
            ttft *= p.tail_factor
        tpot = (p.tpot_ms if model.tpot_ms is None else model.tpot_ms) * math.exp(
            rng.gauss(0.0, p.tpot_sigma))
        out = Plan(model, prompt, uncached - sum(write.values()), cached, write, extra, words,
                   finished, ttft, tpot, otpm_reserved=max_tokens if api == "anthropic" else 0)
        roll = rng.random()
        if roll < p.fault_stall:
            out.fault = "stall"
            if rng.random() < p.stall_midstream_share and len(words) > 1:
                out.pause_at, out.pause_ms = rng.randrange(1, len(words)), p.stall_pause_ms
            else:
                out.ttft_ms *= p.stall_factor
        elif roll < p.fault_stall + p.fault_cut and len(words) > 1:
            out.fault, out.cut_at = "cut", rng.randrange(1, len(words))
        return out

    def _draws(self, body: dict[str, Any]) -> random.Random:
        """One request's own draws (fault, noise, tail, pace): seeded by the seed, what the
        request says (each message's role and text, the system prompt: a proxy's markers,
        cache keys and serialisation aside) and how many times that came before. So every
        path of a run draws the same for the same request, whatever the others' proxies
        served themselves or sent again (a paired comparison), and a retry draws anew."""
        said = [[m.get("role"), _said(m.get("content"))] for m in body.get("messages") or ()
                if isinstance(m, dict)]
        digest = hashlib.blake2b(orjson.dumps([self.seed, _said(body.get("system")), said]),
                                 digest_size=16).digest()
        n = self._seen[digest] = self._seen.get(digest, 0) + 1
        return random.Random(digest + n.to_bytes(4, "big"))

    def settle(self, key: str, plan: Plan, output_tokens: int) -> None:
        """Gives back the OTPM reserved at admission beyond the tokens produced."""
        bucket = self._buckets.get((key, plan.model.name, "output tokens"))
        if bucket is not None:
            bucket.take(output_tokens - plan.otpm_reserved)

    def _admit(self, key: str, model: ModelSpec, now: float, **costs: int) -> None:
        limits = {"requests": model.rpm, "tpm": model.tpm, "itpm": model.itpm,
                  "otpm": model.otpm}
        names = {"requests": "requests", "tpm": "tokens", "itpm": "input tokens",
                 "otpm": "output tokens"}
        checked = []
        for what, cost in costs.items():
            if not limits[what]:
                continue
            bucket = self._buckets.get((key, model.name, names[what]))
            if bucket is None:
                bucket = self._buckets[(key, model.name, names[what])] = _Bucket(
                    limits[what], self.params.limit_window_s, now)
            wait = bucket.wait_s(cost, now)
            if wait > 0:
                raise _limited(model, names[what], limits[what], cost, wait)
            checked.append((bucket, cost))
        for bucket, cost in checked:
            bucket.take(cost)

    def _continued(self, api: str, model: str, body: dict[str, Any], max_tokens: int
                   ) -> tuple[list[str], bool]:
        """The answer, or where the last message is an assistant text the answer to the rest
        starts with (an Anthropic prefill; ``continue_final_message`` on OpenAI's API, as
        vLLM takes it), what follows that text: as a server that continues it would."""
        messages = body.get("messages") or []
        last = messages[-1] if messages else None
        if isinstance(last, dict) and last.get("role") == "assistant" and isinstance(
                last.get("content"), str) and (api == "anthropic"
                                               or body.get("continue_final_message")):
            rest = {**body, "messages": messages[:-1]}
            words, finished = self._answer(model, rest, 0)
            said = last["content"].split()
            if said and words[:len(said)] == said:
                after = words[len(said):]
                if after:  # the first word after the text's last, a space between
                    after[0] = " " + after[0]
                cut = min(len(after), max_tokens) if max_tokens else len(after)
                return after[:cut], finished and cut == len(after)
        return self._answer(model, body, max_tokens)

    def _answer(self, model: str, body: dict[str, Any], max_tokens: int) -> tuple[list[str],
                                                                                     bool]:
        """Deterministic words from (seed, model, prompt); n in [out_min, out_max]."""
        prompt = {k: body.get(k) for k in ("system", "messages", "tools")}
        digest = hashlib.blake2b(orjson.dumps([self.seed, model, prompt],
                                              option=orjson.OPT_SORT_KEYS),
                                 digest_size=32).digest()
        p = self.params
        n = p.out_min + int.from_bytes(digest[:4], "big") % (p.out_max - p.out_min + 1)
        rng = random.Random(digest)
        cut = min(n, max_tokens) if max_tokens else n
        return [rng.choice(_WORDS) for _ in range(cut)], cut == n


def _said(content: Any) -> str:
    """The text of a message's content or a system prompt: a string, or its blocks' texts
    (tool results' included)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_said(b.get("text") if "text" in b else b.get("content"))
                       for b in content if isinstance(b, dict))
    return ""


def _max_tokens(api: str, body: dict[str, Any]) -> int:
    keys = ("max_tokens",) if api == "anthropic" else ("max_completion_tokens", "max_tokens")
    for k in keys:
        value = body.get(k)
        if isinstance(value, int) and value > 0:
            return value
    return 0


def _limited(model: ModelSpec, what: str, limit: int, cost: int, wait: float) -> SimError:
    wait = max(wait, 0.001)
    seconds = str(max(1, math.ceil(wait))).encode()
    if model.api == "openai":
        unit = {"requests": "requests per min (RPM)", "tokens": "tokens per min (TPM)"}[what]
        message = (f"Rate limit reached for {model.name} in organization org-sim on {unit}: "
                   f"Limit {limit}, Requested {cost}. Please try again in {wait:.3f}s.")
        headers = [(b"retry-after", seconds), (b"retry-after-ms", str(math.ceil(wait * 1000))
                                               .encode()),
                   (b"x-ratelimit-limit-" + what.encode(), str(limit).encode()),
                   (b"x-ratelimit-reset-" + what.encode(), f"{wait:.3f}s".encode())]
        return SimError(429, "rate_limit_exceeded", message, "429", headers)
    message = (f"This request would exceed the rate limit for your organization of {limit} "
               f"{what} per minute. Please retry after {seconds.decode()} seconds.")
    header = b"anthropic-ratelimit-" + what.replace(" ", "-").encode() + b"-limit"
    return SimError(429, "rate_limit_error", message, "429",
                    [(b"retry-after", seconds), (header, str(limit).encode())])
