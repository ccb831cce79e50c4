"""Grammar-constrained decoding: a token mask per step, applied inside the batch.

A constrained sequence carries a matcher (llguidance's ``LLMatcher``: an Earley parser over
the grammar's lexemes, which computes the set of tokens that keep the output a prefix of
the language). Before sampling, each constrained row of the step's logits gets the tokens
its matcher forbids set to ``-inf``; unconstrained rows are untouched, so one batch mixes
both. After sampling, the engine feeds each new token to the sequence's matcher. The model
may end (EOS) only where the grammar accepts. As vLLM's and SGLang's structured outputs do
(llguidance, https://github.com/guidance-ai/llguidance; the bitmask layout is theirs:
``[rows, ceil(V / 32)]`` int32, bit ``t % 32`` of word ``t // 32`` set when token ``t`` is
allowed).

Speculative decoding stays on: a drafted sequence's rows are masked position by position
(the matcher advanced over the draft's valid prefix, then rolled back), so a draft token the
grammar forbids has probability 0 at its row and is rejected by the ordinary verification,
and every accepted token is one the grammar allows. Tokens the grammar forces (a call's
fixed head, a property name) are verified as a draft too (``compute_ff_tokens``; see
:meth:`local_engine.scheduler.Scheduler._forced`): always accepted, a run of them costs one
step (jump-forward decoding).

Compilation: :class:`GrammarCompiler` compiles a grammar once per distinct text (keyed by
its SHA-256) and hands each request a copy of the compiled matcher (``deep_copy``: ~10 us),
so the τ-bench airline tools (14 functions) compile in ~10 ms the first time and never again.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import llguidance
import llguidance.hf
import torch

__all__ = ["Grammar", "GrammarCompiler", "GrammarError", "constrain", "json_schema_grammar",
           "lark_grammar"]

#: JSON as the grammar writes it: no free whitespace (a small model cannot loop on spaces),
#: OpenAI's separators.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


#: Text whose tokens must read as the same bytes to the grammar library as to the tokenizer:
#: spaces, a newline and JSON punctuation, where byte-level vocabularies differ from the text.
_PROBE = ' {"name": "Ann", "tags": ["a b"]}\n\tx'


class GrammarError(ValueError):
    """The grammar library rejected a grammar (an unsupported JSON Schema feature, a bad
    ``$ref``, an unknown ``format``); the message is the library's."""


def json_schema_grammar(schema: dict[str, Any]) -> str:
    """The llguidance grammar text of a JSON Schema (compact JSON, see
    :data:`JSON_OPTIONS`). Raises GrammarError when the schema cannot be translated."""
    try:
        return str(llguidance.LLMatcher.grammar_from_json_schema(
            {**schema, "x-guidance": JSON_OPTIONS}))
    except (ValueError, TypeError, RuntimeError) as exc:
        raise GrammarError(str(exc)) from exc


def lark_grammar(lark: str) -> str:
    """The llguidance grammar text of a Lark grammar (llguidance's dialect: ``%json{...}``
    embeds a JSON Schema)."""
    try:
        return str(llguidance.LLMatcher.grammar_from_lark(lark))
    except (ValueError, TypeError, RuntimeError) as exc:
        raise GrammarError(str(exc)) from exc


@dataclass(frozen=True, eq=False)
class Grammar:
    """A compiled grammar: ``key`` is the SHA-256 hex digest of its text."""

    key: str
    template: Any  # llguidance.LLMatcher, never advanced

    def matcher(self) -> Any:
        """A fresh matcher at the grammar's start, for one sequence."""
        return self.template.deep_copy()


class GrammarCompiler:
    """Compiles grammars for one tokenizer (an ``llguidance.LLTokenizer``; see
    :meth:`from_hf`). Keeps the ``capacity`` most recently used grammars. Thread-safe."""

    def __init__(self, tokenizer: Any, capacity: int = 256):
        self.tokenizer = tokenizer
        self.vocab_size: int = tokenizer.vocab_size
        self.capacity = capacity
        self._cache: OrderedDict[str, Grammar] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def from_hf(cls, hf_tokenizer: Any, eos_token_ids: tuple[int, ...] = (),
                capacity: int = 256) -> GrammarCompiler:
        """For a fast Hugging Face tokenizer (~0.6 s for a 49k vocabulary, once), ending
        where any of ``eos_token_ids`` may (the tokenizer's own EOS when empty).
        Raises GrammarError when the library reads the tokenizer's tokens as other bytes
        than the tokenizer decodes them to (a mask built on that view forbids the right
        tokens and allows wrong ones: seen with SmolLM2's GGUF converted by transformers
        5.16-5.17, whose tokenizer.json pairs a byte-level vocabulary with a byte-fallback
        decoder, so that llguidance took "Ġ" for two bytes rather than a space)."""
        eos = list(eos_token_ids) or None
        tokenizer = llguidance.hf.from_tokenizer(hf_tokenizer, eos_token=eos)
        ids = list(hf_tokenizer.encode(_PROBE, add_special_tokens=False))
        seen, decoded = tokenizer.decode_bytes(ids), hf_tokenizer.decode(ids).encode()
        if seen != decoded:
            raise GrammarError(f"the grammar library reads this tokenizer's tokens as "
                               f"{seen[:40]!r} where the tokenizer decodes {decoded[:40]!r}; "
                               "convert the model again with transformers>=5.18")
        return cls(tokenizer, capacity)

    def cached(self, grammar: str) -> Grammar | None:
        """The compiled grammar if it is in the cache (no compilation)."""
        return self._get(hashlib.sha256(grammar.encode()).hexdigest())

    def _get(self, key: str) -> Grammar | None:
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
            return hit

    def compile(self, grammar: str) -> Grammar:
        """The compiled grammar of ``grammar`` (llguidance grammar text, from
        :func:`json_schema_grammar` or :func:`lark_grammar`), from the cache when seen
        before. Raises GrammarError naming what the library rejects."""
        key = hashlib.sha256(grammar.encode()).hexdigest()
        hit = self._get(key)
        if hit is not None:
            return hit
        matcher = llguidance.LLMatcher(self.tokenizer, grammar)
        if matcher.is_error():
            raise GrammarError(matcher.get_error())
        compiled = Grammar(key, matcher)
        with self._lock:
            self._cache[key] = compiled
            while len(self._cache) > self.capacity:
                self._cache.popitem(last=False)
        return compiled

    def check(self, grammar: str) -> str:
        """The library's complaint about ``grammar`` ("" when it is fine), without caching."""
        return str(llguidance.LLMatcher.validate_grammar(grammar, self.tokenizer))


@dataclass(slots=True)
class Constrained:
    """One constrained item of a step: its matcher, its first logits row, its draft."""

    matcher: Any
    first_row: int
    draft: list[int]


def constrain(logits: torch.Tensor, items: list[Constrained]) -> None:
    """Mask ``logits`` [R, V] in place: item i's rows ``first_row + j`` (j = 0 ..
    len(draft)) get ``-inf`` on every token its matcher forbids after the draft's first j
    tokens. Rows past a draft token the grammar forbids are left unmasked: verification
    stops at that token (it has probability 0), so they are never read."""
    if not items:
        return
    rows: list[int] = []
    valids = [item.matcher.validate_tokens(item.draft) if item.draft else 0 for item in items]
    for item, valid in zip(items, valids, strict=True):
        rows.extend(range(item.first_row, item.first_row + valid + 1))
    vocab = logits.shape[-1]
    words = (vocab + 31) // 32
    bitmask = torch.full((len(rows), words), -1, dtype=torch.int32)
    at = 0
    for item, valid in zip(items, valids, strict=True):
        m = item.matcher
        for j in range(valid + 1):
            if j:
                m.consume_token(item.draft[j - 1])
            m.unsafe_compute_mask_ptr(bitmask[at].data_ptr(), words * 4)
            at += 1
        if valid:
            m.rollback(valid)
    shifts = torch.arange(32, dtype=torch.int32)
    allowed = ((bitmask[:, :, None] >> shifts) & 1).bool().view(len(rows), words * 32)
    index = torch.tensor(rows, device=logits.device)
    forbidden = ~allowed[:, :vocab].to(logits.device, non_blocking=True)
    logits[index] = logits[index].masked_fill(forbidden, float("-inf"))
