"""Model families by pattern: ``[models."claude-*"]`` serves every id it matches.

A model entry whose name holds a ``*`` is a **pattern** (LiteLLM's wildcard routes are the
model: ``model_name: "anthropic/*"``, router_utils/pattern_match_deployments.py, and
https://docs.litellm.ai/docs/proxy/configs#provider-specific-wildcard-routing). Only ``*``
is special: each one matches a run of one character or more, and the pattern matches the
whole id (``claude-*`` matches ``claude-haiku-4-5``, not ``xclaude-a`` nor ``claude-``).
When an id can be split more than one way, each ``*`` but the last takes the shortest run
it can. Ids over :data:`MAX_ID_CHARS` characters match no pattern; a pattern is at most
:data:`MAX_PATTERN_CHARS` characters, with no two ``*`` side by side.

A target's ``model`` under a pattern entry is a **template**: ``{model}``, the id as the
client sent it; ``{1}``, ``{2}``...: what the first, second... ``*`` matched; any other
text as it is. ``anthropic/*`` with ``model = "{1}"`` sends ``anthropic/claude-x`` upstream
as ``claude-x``. (LiteLLM writes the same with a ``*`` in the deployment's model; numbered
placeholders say which part goes where.)

**Precedence** (LiteLLM sorts its patterns by length, longest first): an exact name or alias
always wins; among patterns, the one with the most literal (non-``*``) characters, then the
one written first in the config. ``gateway check`` warns about every pair of patterns that
can match one id (:func:`overlap`), naming an id both match.

Pure and I/O-free: the config validates with it (:mod:`gateway.model_config`), the model
table resolves with it (:mod:`gateway.models`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

__all__ = ["MAX_ID_CHARS", "MAX_PATTERN_CHARS", "ModelPattern", "Template", "by_precedence", "is_pattern",
           "overlap"]

#: Longest id a pattern matches (characters): real ids are under 100; a longer one is a
#: 404, so a client cannot make the gateway scan or pass on a huge id.
MAX_ID_CHARS = 256
#: Longest pattern (characters), which keeps :func:`overlap`'s search shallow.
MAX_PATTERN_CHARS = 128


def is_pattern(name: str) -> bool:
    """Whether a model entry's name is a pattern (holds a ``*``)."""
    return "*" in name


class ModelPattern:
    """A model entry's name with ``*`` wildcards (see the module docstring). Raises
    ValueError for two adjacent ``*`` (no single way to split an id between them)."""

    __slots__ = ("_min", "_parts", "literal", "stars", "text")

    def __init__(self, text: str) -> None:
        if len(text) > MAX_PATTERN_CHARS:
            raise ValueError(f"pattern {text[:20]!r}...: over {MAX_PATTERN_CHARS} characters")
        if "**" in text:
            raise ValueError(f"pattern {text!r}: two adjacent '*' (write one)")
        if not is_pattern(text):
            raise ValueError(f"{text!r} is not a pattern: it holds no '*'")
        self.text = text
        #: The literal runs between the stars: stars + 1 of them, the first and last
        #: possibly empty.
        self._parts = tuple(text.split("*"))
        self.stars = len(self._parts) - 1
        #: Literal characters: the more, the more specific (precedence).
        self.literal = len(text) - self.stars
        self._min = self.literal + self.stars  # each star takes one character at least

    def match(self, model: str) -> tuple[str, ...] | None:
        """What each ``*`` matched in ``model`` (in order), or None when it does not match.
        Linear in the id's length (no backtracking regular expression)."""
        parts = self._parts
        head, tail = parts[0], parts[-1]
        n = len(model)
        if (n < self._min or n > MAX_ID_CHARS or not model.startswith(head)
                or not model.endswith(tail)):
            return None
        end = n - len(tail)  # where the last star's run ends
        pos = len(head)
        groups: list[str] = []
        for middle in parts[1:-1]:
            # leftmost, after a run of one character at least: leaves the most room for the
            # rest, so if any split exists this one does (and each run is the shortest)
            found = model.find(middle, pos + 1, end - 1)
            if found < 0:
                return None
            groups.append(model[pos:found])
            pos = found + len(middle)
        if pos >= end:
            return None
        groups.append(model[pos:end])
        return tuple(groups)

    def __repr__(self) -> str:
        return f"ModelPattern({self.text!r})"


def by_precedence(patterns: Sequence[ModelPattern]) -> list[ModelPattern]:
    """``patterns`` (in config order) in the order they are tried: the most literal
    characters first, then config order."""
    order = sorted(range(len(patterns)), key=lambda i: (-patterns[i].literal, i))
    return [patterns[i] for i in order]


class Template:
    """A target's model under a pattern entry: literal text, ``{model}`` and ``{N}`` (1 to
    the pattern's ``stars``). Raises ValueError naming what is wrong: an unknown
    placeholder, a ``{N}`` past the pattern's stars, a lone brace, an empty template."""

    __slots__ = ("_pieces", "literal", "text")

    def __init__(self, text: str, stars: int) -> None:
        if not text:
            raise ValueError("an empty model")
        known = "{model} or {1}" + (f" to {{{stars}}}" if stars > 1 else "")
        self.text = text
        pieces: list[str | int] = []  # text, or 0 (the whole id), N (the Nth star's run)
        for i, piece in enumerate(re.split(r"(\{[^{}]*\})", text)):
            if i % 2 == 0:
                if "{" in piece or "}" in piece:
                    raise ValueError(f"model {text!r}: a lone '{{' or '}}' (placeholders: "
                                     f"{known})")
                if piece:
                    pieces.append(piece)
                continue
            inner = piece[1:-1]
            if inner == "model":
                pieces.append(0)
            elif inner.isdigit() and 1 <= int(inner) <= stars:
                pieces.append(int(inner))
            else:
                raise ValueError(f"model {text!r}: unknown placeholder {piece}; the pattern "
                                 f"has {stars} '*': use {known}")
        self._pieces = tuple(pieces)
        #: The model itself when the template has no placeholder (every id gets it).
        self.literal = text if all(isinstance(p, str) for p in pieces) else None

    def render(self, model: str, groups: tuple[str, ...]) -> str:
        """The upstream model for the id ``model``, whose stars matched ``groups``."""
        if self.literal is not None:
            return self.literal
        return "".join(p if isinstance(p, str) else model if p == 0 else groups[p - 1]
                       for p in self._pieces)


_ANY1, _ANY0 = 1, 0  # a star is one character (_ANY1) then any number more (_ANY0)


def _tokens(pattern: ModelPattern) -> tuple[str | int, ...]:
    out: list[str | int] = []
    for ch in pattern.text:
        out += [_ANY1, _ANY0] if ch == "*" else [ch]
    return tuple(out)


def overlap(a: ModelPattern, b: ModelPattern) -> str | None:
    """An id both patterns match, or None when no id matches both (the product of the two
    patterns' automata, searched depth first; each free character written ``x``)."""
    ta, tb = _tokens(a), _tokens(b)

    @functools.cache
    def common(i: int, j: int) -> str | None:
        if i == len(ta) and j == len(tb):
            return ""
        if i < len(ta) and ta[i] == _ANY0:  # the star's run ends here
            found = common(i + 1, j)
            if found is not None:
                return found
        if j < len(tb) and tb[j] == _ANY0:
            found = common(i, j + 1)
            if found is not None:
                return found
        if i == len(ta) or j == len(tb):
            return None
        x, y = ta[i], tb[j]
        if isinstance(x, str) and isinstance(y, str) and x != y:
            return None
        if x == _ANY0 and y == _ANY0:  # both stay: no progress (the skips above cover it)
            return None
        ch = x if isinstance(x, str) else y if isinstance(y, str) else "x"
        rest = common(i if x == _ANY0 else i + 1, j if y == _ANY0 else j + 1)
        return None if rest is None else ch + rest

    found = common(0, 0)
    return found if found is None or len(found) <= MAX_ID_CHARS else None
