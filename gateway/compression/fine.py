"""The fine pass: inside the units the coarse pass kept, drop the least informative words.

LLMLingua (Jiang et al., EMNLP 2023) scores every token of a prompt by its self-information
under a small language model, ``-log p(t_i | t_<i)``, and drops the lowest until the budget
is met: what the model could guess from what came before tells a larger model little.
LongLLMLingua (Jiang et al., ACL 2024) runs it after its document-level (coarse) step, as
here. The scoring model is the local engine's (SmolLM2-135M-Instruct), called through
:data:`Score`; this module is pure apart from that call.

What may go (each rule keeps text well formed or keeps what a reader needs):

- only inside ``regions``: the kept prose units' text after their document markers, never
  fixed text (the question and instruction, content marked for caching), code, JSON or
  records (:func:`gateway.compression.compress.compress` passes them);
- whole words, never pieces of one: a word is a run of tokens with no boundary between them
  (a token starting with a space or a punctuation mark starts a new one), its information
  the mean of its tokens' (LLMLingua-2, Pan et al., ACL 2024, aggregates token scores to
  words the same way);
- never a word touching a protected span (numbers, identifiers, URLs, code, quoted strings:
  :func:`gateway.compression.units.protected_spans`), nor one holding a line break, a
  bracket or a quote, nor a region's first token (it has no prefix to be scored against),
  nor a capitalised word inside a sentence (a name, most often: the answers to factoid
  questions are names and numbers, and a name's second word is easy to guess from its
  first, so self-information alone drops it);
- the space before a dropped word goes with it; one space is put back where a drop would
  glue two words together, and no line starts with a space it did not have.

Shapes: a :class:`Scored` holds ``offsets`` [n] int64 (the character where each token
starts, non-decreasing) and ``logprobs`` [n] float64 (natural log; NaN for the first
token). Tokens are the scoring model's; the budget is counted in the caller's tokenizer.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import numpy as np

from gateway.compression.tokens import CountTokens
from gateway.compression.units import protected_spans

__all__ = ["FINE", "FineOptions", "Piece", "Score", "Scored", "cut", "fine", "pieces"]


@dataclass(frozen=True, slots=True)
class FineOptions:
    """``slack``: with the fine pass, the coarse step keeps units worth up to this many
    times the budget left beside the fixed text, and the fine pass cuts the rest;
    ``whole``: the most relevant kept units (by the coarse ranking) the fine pass leaves
    whole, cutting inside the others only (LongLLMLingua's dynamic compression ratio, at
    its simplest: the better a document ranks, the less it is compressed);
    ``keep_names``: see :func:`pieces`."""

    slack: float = 1.5
    whole: int = 2
    keep_names: bool = True


#: The defaults, chosen on dev (``bench/compression.py --fine-tune --limit 60``: 59 NQ
#: items whose answer is in the context, gold at positions 1 and 10, each setting against
#: coarse alone at the same token count, which kept every gold answer at 2x and 4x).
#: Leaving the best ranked units whole is what matters: with ``whole`` 0, 54-93% of gold
#: answers survive (a predictable word of an answer, "hit *points*", goes first); with 1
#: or 2, 98.3% at 2x and 4x for every slack (one item lost: its gold ranked third), 100%
#: at 4x with slack 2 and names kept. With ``whole`` 1 or 2, keeping names changes
#: little (it is the safer rule); slack 1.5 scores about half the text slack 2 does at 2x.
FINE = FineOptions()


@dataclass(frozen=True, slots=True)
class Scored:
    """One text as the scoring model read it (see the module's shapes)."""

    offsets: np.ndarray
    logprobs: np.ndarray


#: ``await score(texts)`` -> one :class:`Scored` per text, in order. Raises
#: :class:`~gateway.compression.scoring.ScoringFailed` when the scorer cannot answer.
Score = Callable[[list[str]], Awaitable[list[Scored]]]


@dataclass(frozen=True, slots=True)
class Piece:
    """A word (or a run of punctuation) of the text: [start, end) characters, its scoring
    model ``tokens``, ``info`` its tokens' mean self-information (nats; inf when it holds a
    token with no score), and whether it may be dropped."""

    start: int
    end: int
    tokens: int
    info: float
    droppable: bool


def pieces(text: str, scored: Scored, protected: Sequence[tuple[int, int]] = (),
           base: int = 0, keep_names: bool = True) -> list[Piece]:
    """The words of ``text`` (one region, scored alone), at offsets shifted by ``base``;
    ``protected``: [start, end) spans in the same shifted offsets; ``keep_names``: a
    capitalised word inside a sentence (a name, most often) is not droppable."""
    words: list[tuple[int, list[float]]] = []  # each word's start, its tokens' info
    for j, offset in enumerate(scored.offsets):
        start = min(int(offset), len(text))
        info = -float(scored.logprobs[j]) if j < len(scored.logprobs) else math.nan
        if words and (start <= words[-1][0] or _joined(text, start)):
            words[-1][1].append(info)  # a character another token began, or a word's rest
        else:
            words.append((start, [info]))
    out: list[Piece] = []
    spans = sorted(protected)
    for k, (start, infos) in enumerate(words):
        end = words[k + 1][0] if k + 1 < len(words) else len(text)
        word = text[start:end]
        mean = math.inf if any(math.isnan(v) for v in infos) else sum(infos) / len(infos)
        droppable = (mean != math.inf and bool(word.strip()) and "\n" not in word
                     and not any(c in _PAIRED for c in word)
                     and not _touches(start + base, end + base, spans)
                     and not (keep_names and _name(text, start, word)))
        out.append(Piece(start + base, end + base, len(infos), mean, droppable))
    return out


def _joined(text: str, start: int) -> bool:
    """Whether the token starting at ``start`` continues the word before it: both sides
    are word characters, or an apostrophe inside a word ("don't") sits at the edge."""
    if not 0 < start < len(text):
        return False
    here, before = text[start], text[start - 1]
    if _wordy(before):
        return _wordy(here) or here in _APOSTROPHES
    return (before in _APOSTROPHES and _wordy(here) and start > 1
            and _wordy(text[start - 2]))


_APOSTROPHES = "'’"
#: Brackets and quotes: dropping one of a pair would leave the other dangling.
_PAIRED = "()[]{}<>\"\u201c\u201d"


def _wordy(char: str) -> bool:
    return char.isalnum() or char == "_"


def _name(text: str, start: int, word: str) -> bool:
    """A capitalised word that does not start a sentence (the region, or after ``.!?``)."""
    if not word.lstrip()[:1].isupper():
        return False
    i = start - 1
    while i >= 0 and text[i].isspace():
        i -= 1
    return i >= 0 and text[i] not in ".!?"


def _touches(start: int, end: int, spans: Sequence[tuple[int, int]]) -> bool:
    return any(s < end and e > start for s, e in spans)


def cut(text: str, drop: Sequence[Piece]) -> str:
    """``text`` without the pieces ``drop`` (sorted by start, within ``text``): each goes
    with its own leading space; where that glues two words together, one space is put
    back; what follows a drop loses its leading spaces where the text before it ends in
    whitespace (a line's start, a space); a line keeps its indentation."""
    out: list[str] = []
    at = 0
    for piece in drop:
        start = piece.start
        if not text[text.rfind("\n", 0, start) + 1:start].strip():
            # a line's first word: its leading whitespace is the line's indentation
            start += len(text[start:piece.end]) - len(text[start:piece.end].lstrip())
        out.append(text[at:start])
        at = piece.end
    out.append(text[at:])
    # Join the kept runs: each boundary is a place where something was dropped.
    joined = out[0]
    for run in out[1:]:
        if not run:
            continue
        if not joined or joined[-1].isspace():
            run = run.lstrip(" \t")
        elif joined[-1].isalnum() and run[0].isalnum():
            run = " " + run  # "Marie" + "Curie", once " Skłodowska-" went
        joined += run
    return joined


async def fine(text: str, regions: Sequence[tuple[int, int]], limit: int,
               count: CountTokens, score: Score, keep_names: bool = FINE.keep_names
               ) -> str | None:
    """``text`` cut to at most ``limit`` tokens (``count``) by dropping the least
    informative words inside ``regions`` ([start, end) character spans of ``text``, sorted,
    disjoint); ``text`` itself when it already fits; None when the words that may go are
    too few to reach the budget (then nothing is scored, when that shows before scoring).
    ``keep_names``: see :func:`pieces`. Raises what ``score`` raises."""
    total = count(text)
    if total <= limit:
        return text
    protected = protected_spans(text)
    # Without a score yet: could dropping every free word reach the budget at all?
    free = sum(e - s for s, e in regions) - sum(
        min(e, re) - max(s, rs) for rs, re in regions for s, e in protected
        if s < re and e > rs)
    if free * total < (total - limit) * len(text):
        return None
    scored = await score([text[s:e] for s, e in regions])
    words: list[Piece] = []
    for (s, e), one in zip(regions, scored, strict=True):
        words += pieces(text[s:e], one, [(a, b) for a, b in protected if a < e and b > s], s,
                        keep_names)
    order = sorted((p for p in words if p.droppable), key=lambda p: (p.info, p.start))

    def without(k: int) -> str:  # the text less the k least informative words
        return cut(text, sorted(order[:k], key=lambda p: p.start))

    # The fewest words whose dropping meets the budget: binary search (the count falls as
    # words go, up to how a join tokenizes), a dozen counts of the text at most.
    lo, hi = 0, len(order)
    if count(without(hi)) > limit:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if count(without(mid)) <= limit:
            hi = mid
        else:
            lo = mid
    return without(hi)
