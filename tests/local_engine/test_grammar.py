"""Grammar-constrained decoding in the engine: the token mask inside a batch, with drafts.

The tiny random model of conftest (token i is one character) decodes under JSON Schema
grammars: whatever it samples, the output parses and validates, in a batch shared with
free sequences, with and without n-gram speculation.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import jsonschema
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from local_engine.engine import Engine
from local_engine.grammar import (
    Constrained,
    GrammarCompiler,
    GrammarError,
    constrain,
    json_schema_grammar,
)
from local_engine.sequence import SamplingParams
from local_engine.speculative import SpecConfig

SCHEMA = {"type": "object", "properties": {
    "id": {"type": "integer", "minimum": 0, "maximum": 9999}, "tag": {"type": "string", "enum": ["a", "bc"]},
    "xs": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}},
    "required": ["id", "tag", "xs"], "additionalProperties": False}


def run(engine: Engine, jobs: list[tuple[list[int], SamplingParams]],
        forced: list[int] | None = None) -> list[str]:
    """The outputs; ``forced`` gets the tokens the grammar forced, step by step."""
    seqs = [engine.add(ids, params) for ids, params in jobs]
    while engine.has_work():
        engine.step()
        if forced is not None:
            forced.append(engine.last.forced)
    return [seq.text for seq in seqs]


def test_constrained_outputs_validate_in_a_mixed_batch_with_drafts(
        make_engine: Callable[..., Engine], char_grammars: GrammarCompiler,
        batch_invariant: bool) -> None:
    """Greedy and sampled constrained rows beside a free one, n-gram drafts on (each
    sequence drafts from its own loop; the grammar decides which draft tokens can stand) and
    the tokens the grammar forces verified as drafts."""
    spec = SpecConfig(num_tokens=4, min_n=1, max_n=2)
    engine = make_engine(speculative=spec)
    grammar = char_grammars.compile(json_schema_grammar(SCHEMA))
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7]  # a loop, so the proposer drafts
    jobs = [(prompt, SamplingParams(temperature=t, seed=s, max_tokens=60, grammar=grammar))
            for t in (0.0, 1.0) for s in range(2)]
    free = (prompt, SamplingParams(temperature=0, max_tokens=30))
    forced: list[int] = []
    *texts, plain = run(engine, [*jobs, free], forced)
    for text in texts:
        jsonschema.validate(json.loads(text), SCHEMA)
    # drafts were verified, and what the grammar forces ('{"id": ', '"tag": ') came as ones
    assert engine.decode_tokens > engine.decodes and sum(forced) >= len(jobs) * 6
    if batch_invariant:  # the free row untouched
        assert plain == run(make_engine(speculative=spec), [free])[0]


def test_a_draft_token_the_grammar_forbids_gets_no_probability(
        char_grammars: GrammarCompiler) -> None:
    grammar = char_grammars.compile(json_schema_grammar({"type": "integer"}))
    matcher = grammar.matcher()
    digit, letter = ord("7") - 32, ord("x") - 32
    logits = torch.zeros(4, 96)
    constrain(logits, [Constrained(matcher, 0, [digit, letter, digit])])
    allowed = [set((logits[r] > float("-inf")).nonzero().flatten().tolist()) for r in range(4)]
    assert digit in allowed[0] and letter not in allowed[0]
    assert digit in allowed[1] and letter not in allowed[1]
    assert 1 in allowed[1]  # "7" is a whole integer: EOS may follow
    assert allowed[2] == allowed[3] == set(range(96))  # past the forbidden token: unread
    assert matcher.validate_tokens([letter]) == 0  # the matcher is back at the start


def test_a_grammar_is_compiled_once(char_grammars: GrammarCompiler) -> None:
    text = json_schema_grammar({"type": "array", "items": {"type": "integer"}})
    first = char_grammars.compile(text)
    assert char_grammars.compile(text) is first and char_grammars.cached(text) is first
    a, b = first.matcher(), first.matcher()
    assert a.consume_token(ord("[") - 32) and b.validate_tokens([ord("]") - 32]) == 0


def _byte_level_tokenizer(decoder: object, byte_fallback: bool = False
                          ) -> PreTrainedTokenizerFast:
    """conftest's character vocabulary as a byte-level BPE with ``decoder``."""
    vocab = {("Ġ" if i == 0 else chr(32 + i)): i for i in range(95)}
    vocab["Ċ"] = 95  # "\n", byte-level
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=byte_fallback))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoder  # type: ignore[assignment]
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)


def test_a_tokenizer_the_library_reads_as_other_bytes_is_refused() -> None:
    """transformers 5.16-5.17 converted SmolLM2's GGUF tokenizer with a byte-fallback
    decoder: llguidance then read "Ġ" as two bytes instead of a space and its masks allowed
    wrong tokens (every constrained output broke its grammar on the first space)."""
    assert GrammarCompiler.from_hf(_byte_level_tokenizer(decoders.ByteLevel())).vocab_size == 96
    # what transformers 5.17 wrote: the text decodes right, llguidance reads "Ġ" as is
    broken = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse(),
                                decoders.Replace("\u2581", " "), decoders.ByteLevel()])
    tokenizer = _byte_level_tokenizer(broken, byte_fallback=True)
    assert tokenizer.decode(tokenizer.encode(' {"a": 1}', add_special_tokens=False)) == ' {"a": 1}'
    with pytest.raises(GrammarError, match="transformers>=5.18"):
        GrammarCompiler.from_hf(tokenizer)
