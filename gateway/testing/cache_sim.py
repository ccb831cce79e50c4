"""Deterministic simulators of the providers' prompt caches, for the fake upstreams and benches.

Each is fed the exact upstream request body it received and returns the usage the provider
would report. They are pure apart from their own cache state; time (seconds) comes from an
injectable clock or the ``now`` of each call, so a bench can run simulated time.

Anthropic (https://docs.anthropic.com/en/docs/build-with-claude/prompt-caching),
:class:`AnthropicCache`:

- the prompt is a sequence of blocks in the cache's order, whatever the body's key order:
  each tool, each system block (a string system: one block), each message content block (a
  string content: one block); ``tool_choice`` and ``thinking`` belong to the prefix from the
  first system or message block on (the docs: changing them invalidates those caches);
- the prefix ending at block i is hashed over the canonical serialisation of blocks 0..i
  (orjson, keys in the order sent, ``cache_control`` left out, message blocks with their
  role), so a moved or re-keyed block changes every later prefix;
- breakpoints: blocks with ``cache_control`` (a tool_result's inner marker counts as the
  tool_result's), and the last block when the body has a top-level ``cache_control``
  (automatic caching); more than 4: :class:`ValueError`, as the API answers 400;
- read: at each breakpoint, the prefix ending there or at one of the ``lookback`` (20) blocks
  before it whose entry is alive; the longest over all breakpoints is read and its expiry
  refreshed;
- write: an entry at each breakpoint whose prefix reaches the model's minimum
  (:func:`anthropic_min_tokens`); it lives ``ttl`` (5m, or 1h) from its last use. The tokens
  from the read to the last breakpoint written are cache creation, each segment charged at
  the TTL of the breakpoint that ends it; shorter prefixes are neither written nor read;
- usage: ``input_tokens`` (the rest), ``cache_read_input_tokens``,
  ``cache_creation_input_tokens`` and ``cache_creation.ephemeral_{5m,1h}_input_tokens``.

OpenAI automatic caching (https://platform.openai.com/docs/guides/prompt-caching),
:class:`OpenAICache`:

- the prompt as tokens: each tool (its JSON as sent, in the body's order), then each message
  rendered (role, name, content text or parts, tool calls' ids, names and argument strings,
  tool_call_id), tokenized piece by piece (:func:`openai_prompt`);
- routed to one of ``machines`` by a hash of its first 256 tokens and ``prompt_cache_key``;
- each machine remembers the prefixes it served at 128-token boundaries from 1024 on (an LRU
  of ``capacity`` entries, each forgotten ``ttl_s`` after its last use, or 24 h after it
  with ``prompt_cache_retention: "24h"``);
- ``cached_tokens``: the longest remembered boundary prefix (0 for prompts under 1024).

Tokens are o200k_base (``bpe_openai``) for both: not Claude's tokenizer, but consistent,
which is all the comparisons need. Not modelled: Anthropic's isolation per workspace and
invalidation by images, OpenAI's overflow of a prefix sent more than ~15 times a minute to
further machines, any capacity figure of the real caches (``capacity`` is a knob).

:class:`CacheSims` is what the fakes use (``simulate_cache=True``): one simulator pair per
``x-fake-cache-scope`` header value, ``now`` from the ``x-fake-clock`` header when sent.
"""

from __future__ import annotations

import hashlib
import time
import warnings
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import orjson

__all__ = ["ANTHROPIC_MIN_TOKENS", "MAX_BREAKPOINTS", "TTL_S", "AnthropicCache", "Block",
           "CacheSims", "OpenAICache", "PromptUsage", "Tokenizer", "anthropic_min_tokens",
           "anthropic_prefix", "common_tokens", "openai_prompt"]

Clock = Callable[[], float]

#: Anthropic's minimum cacheable prefix (tokens) by model-name prefix, first match wins, else
#: 1024 (Sonnet 4.5, Opus 4.1, Opus 4, Sonnet 4, Sonnet 3.7...). From the prompt-caching docs.
ANTHROPIC_MIN_TOKENS: tuple[tuple[str, int], ...] = (
    ("claude-opus-4-6", 4096), ("claude-opus-4-5", 4096), ("claude-haiku-4-5", 4096),
    ("claude-sonnet-4-6", 2048), ("claude-3-5-haiku", 2048), ("claude-3-haiku", 2048))
#: Anthropic's cache_control ``ttl`` values, in seconds.
TTL_S = {"5m": 300.0, "1h": 3600.0}
#: Breakpoints (cache_control markers) one Anthropic request may carry.
MAX_BREAKPOINTS = 4
_DAY_S = 86_400.0


def anthropic_min_tokens(model: str) -> int:
    """The minimum cacheable prefix (tokens) of an Anthropic ``model`` (ANTHROPIC_MIN_TOKENS)."""
    return next((n for prefix, n in ANTHROPIC_MIN_TOKENS if model.startswith(prefix)), 1024)


class Tokenizer:
    """Text -> token ids as bytes (uint32, 4 bytes a token), memoised per text (at most
    ``memo`` texts, then the memo starts over). ``encode``: text -> ids; default o200k_base
    from ``bpe_openai``, loaded on first use."""

    def __init__(self, encode: Callable[[str], Sequence[int]] | None = None,
                 memo: int = 100_000) -> None:
        self._encode = encode
        self._memo: dict[str, bytes] = {}
        self._max = memo

    def tokens(self, text: str) -> bytes:
        out = self._memo.get(text)
        if out is None:
            if self._encode is None:
                self._encode = _o200k()
            if len(self._memo) >= self._max:
                self._memo.clear()
            out = self._memo[text] = array("I", self._encode(text)).tobytes()
        return out

    def count(self, text: str) -> int:
        return len(self.tokens(text)) // 4


def _o200k() -> Callable[[str], Sequence[int]]:
    with warnings.catch_warnings():  # it reads its data with a deprecated importlib call
        warnings.simplefilter("ignore", DeprecationWarning)
        import bpe_openai

        encode: Callable[[str], Sequence[int]] = bpe_openai.get_encoding(
            "o200k_base").encode_ordinary
        return encode


# -- Anthropic -------------------------------------------------------------------------------

class Block(NamedTuple):
    """One block of an Anthropic prompt: ``digest`` of the prefix ending with it, ``end`` the
    length of that prefix (tokens), ``ttl_s`` of its cache breakpoint (None: not one)."""

    digest: bytes
    end: int
    ttl_s: float | None


def anthropic_prefix(body: Mapping[str, Any], tokenizer: Tokenizer) -> list[Block]:
    """The blocks of a Messages request ``body`` in cache order (tools, system, messages)."""
    out: list[Block] = []
    digest, end = b"", 0
    for key, text, control in _anthropic_pieces(body):
        digest = hashlib.blake2b(digest + key, digest_size=16).digest()
        end += tokenizer.count(text)
        out.append(Block(digest, end, _ttl(control)))
    auto = body.get("cache_control")
    if isinstance(auto, dict) and out and out[-1].ttl_s is None:
        out[-1] = out[-1]._replace(ttl_s=_ttl(auto))
    return out


def _anthropic_pieces(body: Mapping[str, Any]) -> Iterator[tuple[bytes, str, Any]]:
    """(what is hashed, what is counted, cache_control or None) for each block."""
    for tool in body.get("tools") or ():
        clean, control = _strip(tool)
        raw = orjson.dumps(clean)
        yield b"tool:" + raw, raw.decode(), control
    blocks = [("system", block) for block in _blocks(body.get("system"))]
    for message in body.get("messages") or ():
        blocks += [(str(message.get("role")), block) for block in _blocks(message.get("content"))]
    settings = orjson.dumps([body.get("tool_choice"), body.get("thinking")])
    for i, (role, block) in enumerate(blocks):
        clean, control = _strip(block)
        raw = orjson.dumps(clean)
        head = role.encode() + b":"
        yield (settings + head if i == 0 else head) + raw, _text(clean, raw), control


def _blocks(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return list(content) if isinstance(content, list) else []


def _strip(block: Any) -> tuple[Any, Any]:
    """The block without its cache_control (and its inner blocks' ones), and the marker."""
    if not isinstance(block, dict):
        return block, None
    control = block.get("cache_control")
    clean = {k: v for k, v in block.items() if k != "cache_control"}
    inner = clean.get("content")
    if isinstance(inner, list) and any(isinstance(b, dict) and "cache_control" in b
                                       for b in inner):
        stripped = [_strip(b) for b in inner]
        clean["content"] = [b for b, _ in stripped]
        control = control or next((c for _, c in reversed(stripped) if c), None)
    return clean, control


def _text(block: Any, raw: bytes) -> str:
    """What a block counts as: its text, else its JSON."""
    if isinstance(block, dict):
        kind = block.get("type")
        if kind in ("text", "thinking") and isinstance(block.get(kind), str):
            return str(block[kind])
        if kind == "tool_result" and isinstance(block.get("content"), str):
            return str(block["content"])
    return raw.decode()


def _ttl(control: Any) -> float | None:
    if not isinstance(control, dict):
        return None
    return TTL_S.get(str(control.get("ttl", "5m")), TTL_S["5m"])


class AnthropicCache:
    """Anthropic's prompt cache (module docstring): ``usage(body)`` -> the usage fields.

    ``min_tokens``: model name -> minimum cacheable prefix (tokens); ``lookback``: blocks
    checked before each breakpoint; ``clock``: seconds, used when ``usage`` gets no ``now``.
    """

    def __init__(self, tokenizer: Tokenizer | None = None, clock: Clock = time.monotonic,
                 lookback: int = 20, min_tokens: Callable[[str], int] = anthropic_min_tokens,
                 ) -> None:
        self.tokenizer = tokenizer or Tokenizer()
        self.clock, self.lookback, self.min_tokens = clock, lookback, min_tokens
        self._entries: dict[bytes, tuple[float, float]] = {}  # digest -> (expires at, ttl)

    def usage(self, body: Mapping[str, Any], now: float | None = None) -> dict[str, Any]:
        """Reads and writes the cache for ``body``; returns ``input_tokens``,
        ``cache_read_input_tokens``, ``cache_creation_input_tokens`` and ``cache_creation``
        (by TTL), in tokens. Raises ValueError for more than 4 breakpoints."""
        now = self.clock() if now is None else now
        blocks = anthropic_prefix(body, self.tokenizer)
        marks = [i for i, block in enumerate(blocks) if block.ttl_s is not None]
        if len(marks) > MAX_BREAKPOINTS:
            raise ValueError(f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may "
                             f"be provided. Found {len(marks)}.")
        read_at = -1
        for i in marks:  # each breakpoint looks back; the longest hit wins
            for j in range(i, max(read_at, i - self.lookback - 1), -1):
                if self._alive(blocks[j].digest, now):
                    read_at = j
                    break
        read = blocks[read_at].end if read_at >= 0 else 0
        if read_at >= 0:
            self._keep(blocks[read_at].digest, now, self._entries[blocks[read_at].digest][1])
        floor = self.min_tokens(str(body.get("model", "")))
        written = dict.fromkeys(TTL_S, 0)
        done = read
        for i in marks:
            block = blocks[i]
            if block.end < floor or block.ttl_s is None:
                continue
            self._keep(block.digest, now, block.ttl_s)
            if block.end > done:
                written["1h" if block.ttl_s >= TTL_S["1h"] else "5m"] += block.end - done
                done = block.end
        if len(self._entries) > 200_000:
            self._entries = {d: e for d, e in self._entries.items() if e[0] > now}
        total = blocks[-1].end if blocks else 0
        creation = sum(written.values())
        return {"input_tokens": total - read - creation, "cache_read_input_tokens": read,
                "cache_creation_input_tokens": creation,
                "cache_creation": {"ephemeral_5m_input_tokens": written["5m"],
                                   "ephemeral_1h_input_tokens": written["1h"]}}

    def _alive(self, digest: bytes, now: float) -> bool:
        entry = self._entries.get(digest)
        return entry is not None and entry[0] > now

    def _keep(self, digest: bytes, now: float, ttl: float) -> None:
        """Writes or refreshes an entry: it lives ``ttl`` from now, or longer if it did."""
        old = self._entries.get(digest)
        expires = now + ttl if old is None else max(old[0], now + ttl)
        self._entries[digest] = (expires, max(ttl, old[1]) if old else ttl)


# -- OpenAI ----------------------------------------------------------------------------------

class PromptUsage(NamedTuple):
    """What an OpenAI request's usage says of its prompt (tokens), and the machine it hit."""

    prompt_tokens: int
    cached_tokens: int
    machine: int


def openai_prompt(body: Mapping[str, Any], tokenizer: Tokenizer) -> bytes:
    """A Chat Completions ``body``'s prompt as token ids (uint32 bytes): tools, then messages,
    each as sent (module docstring)."""
    parts = [tokenizer.tokens("<tool>" + orjson.dumps(tool).decode())
             for tool in body.get("tools") or ()]
    parts += [tokenizer.tokens(_render(message)) for message in body.get("messages") or ()
              if isinstance(message, dict)]
    return b"".join(parts)


def _render(message: Mapping[str, Any]) -> str:
    out = [f"<|{message.get('role')}|>"]
    if message.get("name"):
        out.append(f"name={message['name']}")
    content = message.get("content")
    if isinstance(content, str):
        out.append(content)
    for part in content if isinstance(content, list) else ():
        is_text = isinstance(part, dict) and part.get("type") == "text"
        out.append(str(part.get("text", "")) if is_text else orjson.dumps(part).decode())
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        out.append(f"<call {call.get('id')}>{function.get('name')}"
                   f"({function.get('arguments')})")
    if message.get("tool_call_id"):
        out.append(f"<result {message['tool_call_id']}>")
    return "\n".join(out)


def common_tokens(a: bytes, b: bytes) -> int:
    """Length (tokens) of the longest common prefix of two token sequences (uint32 bytes)."""
    lo, hi = 0, min(len(a), len(b)) // 4
    while lo < hi:  # prefix equality is monotone: binary search on memcmp
        mid = (lo + hi + 1) // 2
        if a[:mid * 4] == b[:mid * 4]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class OpenAICache:
    """OpenAI's automatic prompt caching (module docstring): ``usage(body)`` -> PromptUsage.

    ``machines``: simulated cache machines; ``ttl_s``: idle seconds before an entry is
    forgotten (the docs say 5-10 minutes; 300 by default, the short end); ``capacity``:
    entries (128-token boundaries) per machine, LRU; ``min_tokens``, ``step``: 1024 and 128;
    ``route_tokens``: how many leading tokens pick the machine (about 256, per the docs).
    """

    def __init__(self, tokenizer: Tokenizer | None = None, clock: Clock = time.monotonic,
                 machines: int = 8, ttl_s: float = 300.0, capacity: int = 65_536,
                 min_tokens: int = 1024, step: int = 128, route_tokens: int = 256) -> None:
        self.tokenizer = tokenizer or Tokenizer()
        self.clock, self.ttl_s, self.capacity = clock, ttl_s, capacity
        self.min_tokens, self.step, self.route_tokens = min_tokens, step, route_tokens
        self._machines: list[OrderedDict[bytes, float]] = [OrderedDict()
                                                           for _ in range(machines)]

    def machine_of(self, prompt: bytes, key: str | None) -> int:
        """The machine a prompt (uint32 token bytes) and ``prompt_cache_key`` route to."""
        seed = prompt[:self.route_tokens * 4] + b"\0" + (key or "").encode()
        digest = hashlib.blake2b(seed, digest_size=8).digest()
        return int.from_bytes(digest, "big") % len(self._machines)

    def usage(self, body: Mapping[str, Any], now: float | None = None) -> PromptUsage:
        """Reads and writes the cache for ``body``: its prompt tokens, the cached ones."""
        now = self.clock() if now is None else now
        prompt = openai_prompt(body, self.tokenizer)
        n = len(prompt) // 4
        key = body.get("prompt_cache_key")
        machine = self.machine_of(prompt, key if isinstance(key, str) else None)
        cache = self._machines[machine]
        ttl = _DAY_S if body.get("prompt_cache_retention") == "24h" else self.ttl_s
        hasher, start, cached = hashlib.blake2b(digest_size=16), 0, 0
        for k in range(self.min_tokens, n + 1, self.step):
            hasher.update(prompt[start * 4:k * 4])
            start, digest = k, hasher.copy().digest()
            expires = cache.get(digest)
            if expires is not None and expires > now:
                cached = k
            cache[digest] = max(expires or 0.0, now + ttl)
            cache.move_to_end(digest)
        while len(cache) > self.capacity:
            cache.popitem(last=False)
        return PromptUsage(n, cached, machine)


# -- for the fakes ---------------------------------------------------------------------------

class CacheSims:
    """The fakes' simulators: one :class:`AnthropicCache` and one :class:`OpenAICache` per
    ``x-fake-cache-scope`` header value (so a bench's runs stay apart in one fake), sharing
    one tokenizer; ``now`` is the ``x-fake-clock`` header (seconds) when sent, else ``clock``.
    """

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self.clock = clock
        self._tokenizer: Tokenizer | None = None
        self._anthropic: dict[str, AnthropicCache] = {}
        self._openai: dict[str, OpenAICache] = {}

    def anthropic(self, body: Mapping[str, Any], headers: Mapping[str, str]) -> dict[str, Any]:
        """The usage cache fields of a Messages request (AnthropicCache.usage)."""
        scope, now = self._steer(headers)
        sim = self._anthropic.get(scope)
        if sim is None:
            sim = self._anthropic[scope] = AnthropicCache(self._shared(), self.clock)
        return sim.usage(body, now)

    def openai(self, body: Mapping[str, Any], headers: Mapping[str, str]) -> PromptUsage:
        """The prompt and cached tokens of a Chat Completions request (OpenAICache.usage)."""
        scope, now = self._steer(headers)
        sim = self._openai.get(scope)
        if sim is None:
            sim = self._openai[scope] = OpenAICache(self._shared(), self.clock)
        return sim.usage(body, now)

    def _steer(self, headers: Mapping[str, str]) -> tuple[str, float | None]:
        clock = headers.get("x-fake-clock")
        return headers.get("x-fake-cache-scope", ""), float(clock) if clock else None

    def _shared(self) -> Tokenizer:
        if self._tokenizer is None:
            self._tokenizer = Tokenizer()
        return self._tokenizer
