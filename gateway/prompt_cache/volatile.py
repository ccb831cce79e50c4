"""Volatile lines: what changes from one request to the next in an otherwise stable system
prompt, found on evidence only.

A timestamp in a system prompt makes every request's prefix new, and the provider's prompt
cache never hits (Anthropic and OpenAI reuse byte-identical prefixes only). Moving the line
to the end of the request keeps the prefix stable; moving the wrong line changes what the
request means. So a line is volatile only on evidence, one of:

- **changed** (kind ``changed``): it was seen to change between requests of the same gateway
  key and model whose system prompts were otherwise identical
  (:meth:`gateway.prompt_cache.memory.PromptMemory.changed_lines`);
- **a metadata line** (kinds ``timestamp``, ``id``): the whole line is a known statement of
  the request's time or id, a label and a value and nothing else: "Current date:
  2024-05-15", "Today is Wednesday, May 15, 2024.", "The current time is 2024-05-15
  15:00:00 EST.", "Current date and time (UTC): 15:00", "Request ID: req_01HX9", "Session id
  = 7f3a9c12" (:data:`TIME_LABEL`, :data:`ID_LABEL` and a date, time or id value);
- a line holding a match of one of the policy's ``patterns`` (kind ``custom``): the
  operator's own evidence.

And only where moving it is safe (:func:`plan`): the line stands on its own in the system
prompt (:func:`gateway.prompt_cache.structure.standalone`: never inside a document, list,
table, code, JSON or tagged block), is at most :data:`LINE_MAX` characters, and leaves its
text non-empty; and a request moves at most :data:`MAX_LINES` lines, together at most
:data:`MAX_SHARE` of the system prompt's tokens (estimated: :data:`MOVED_CHARS_PER_TOKEN`
and :data:`PROMPT_CHARS_PER_TOKEN`). Past those bounds
nothing moves at all: so many "volatile" lines are content, not metadata. What moves,
moves verbatim (:mod:`gateway.prompt_cache.relocate` says where to). Pure.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from gateway.prompt_cache.structure import standalone

__all__ = ["ID_LABEL", "KINDS", "LINE_MAX", "MAX_LINES", "MAX_SHARE", "MOVED_CHARS_PER_TOKEN",
           "PROMPT_CHARS_PER_TOKEN", "TIME_LABEL", "ClassifyLine", "Cut", "Detector", "Moved",
           "fingerprints", "plan"]

#: The kinds of moved lines, as the log line counts them.
KINDS = ("timestamp", "id", "custom", "changed")

#: A line longer than this (characters, stripped) never moves.
LINE_MAX = 160
#: A request moves at most this many lines...
MAX_LINES = 3
#: ... together at most this share of the system prompt's tokens, estimated from characters:
MAX_SHARE = 0.05
#: dates, times and ids tokenize densely (o200k_base: 2.0-2.7 characters a token for the
#: metadata lines in the tests), so a moved line counts its characters / 2;
MOVED_CHARS_PER_TOKEN = 2.0
#: English prose tokenizes at ~4.9 characters a token (the τ-bench system prompt: 6,155
#: characters, 1,248 tokens), so the prompt counts its characters / 5. Together: the moved
#: lines hold at most 2% of the prompt's characters, about 4.3% of its tokens.
PROMPT_CHARS_PER_TOKEN = 5.0

_MONTH = (r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
          r"|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)\.?")
_WEEKDAY = r"(?:Mon|Tue(?:s)?|Wed(?:nes)?|Thu(?:rs?)?|Fri|Sat(?:ur)?|Sun)(?:day)?\.?"
_ZONE = r"(?:\s?(?:Z|UTC|GMT|[+-]\d{2}(?::?\d{2})?|[A-Z]{2,4}T?)(?![A-Za-z]))?"
_TIME = (r"\d{1,2}:\d{2}(?::\d{2}(?:[.,]\d{1,9})?)?(?:\s?(?:[AaPp]\.[Mm]\.|[AaPp][Mm]\b))?"
         rf"{_ZONE}|\d{{1,2}}\s?(?:am|pm|AM|PM){_ZONE}")
_AT_TIME = rf"(?:,?\s+(?:at\s+)?(?:{_TIME}))?"
_ORDINAL = r"(?:st|nd|rd|th)?"
_YEAR = r"(?:,?\s+\d{4})?"
_DATE = (rf"\d{{4}}-\d{{2}}-\d{{2}}(?:(?:T|\s+)(?:{_TIME}))?"
         rf"|(?:\d{{1,2}}/\d{{1,2}}/\d{{2,4}}|\d{{1,2}}\.\d{{1,2}}\.\d{{4}}|\d{{4}}/\d{{2}}/\d{{2}})"
         rf"{_AT_TIME}"
         rf"|(?:{_WEEKDAY},?\s+)?(?:{_MONTH}\s+\d{{1,2}}{_ORDINAL}{_YEAR}"
         rf"|(?:the\s+)?\d{{1,2}}{_ORDINAL}\s+(?:of\s+)?{_MONTH}{_YEAR}|{_MONTH}\s+\d{{4}}){_AT_TIME}")
#: A date, a time, both, a weekday, or epoch seconds or milliseconds (2017-2033); a weekday
#: or zone in parentheses may follow.
_WHEN = (rf"(?:(?:{_DATE})|(?:{_TIME})(?:,?\s+(?:on\s+)?(?:{_DATE}))?|{_WEEKDAY}"
         rf"|1[5-9]\d{{8}}(?:\d{{3}})?)(?:\s*\((?:{_WEEKDAY}|[A-Za-z /_+-]{{1,40}})\))?")
_ID = (r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
       r"|(?=[\w.:-]*\d)[\w.:-]{4,64}")

#: Labels of a line stating the request's time: "Current date:", "Today's date is", "The
#: current time is", "Today is", "Current date and time (UTC):", "Now:", "It is now".
TIME_LABEL = (r"(?:(?:the\s+)?(?:current|today'?s|present)\s+(?:local\s+|utc\s+)?"
              r"(?:date\s*(?:and|&|/)\s*time|datetime|date|time|day|timestamp)"
              r"|(?:the\s+)?(?:date|time)\s+(?:today|now)|today|(?:right\s+)?now|it)")
#: Labels of a line stating the request's or session's id: "Request ID:", "session_id =".
ID_LABEL = (r"(?:request|session|trace|correlation|conversation|run|span|transaction|thread"
            r"|chat)[\s_-]?id")
_SEPARATOR = r"(?:\s*\([^()]{1,24}\))?(?:\s+is\b|\s*[:=]|\s+-)"
_DECORATION = r"[*_]{0,2}"
_LINE = re.compile(
    rf"\[?{_DECORATION}(?:(?P<time>{TIME_LABEL})|(?P<id>{ID_LABEL})){_SEPARATOR}"
    rf"{_DECORATION}(?:\s+(?:now|currently)\b)?\s*{_DECORATION}"
    rf"(?P<value>[^\s*_].*?){_DECORATION}[.;]?\]?",
    re.IGNORECASE)
_WHEN_VALUE = re.compile(_WHEN)
_ID_VALUE = re.compile(_ID)


@dataclass(frozen=True, slots=True)
class Moved:
    """A line that leaves the system prompt: its ``text``, verbatim (without its newline),
    and why (``kind``, one of :data:`KINDS`)."""

    text: str
    kind: str


#: A text after :func:`plan`: what is left of it, and the lines that left, in order.
Cut = tuple[str, tuple[Moved, ...]]


class Detector:
    """Tells a metadata line (rules in the module docstring) from any other. ``extra``: the
    policy's ``patterns`` (kind ``custom``); raises ``re.error`` for a bad one."""

    __slots__ = ("_extra",)

    def __init__(self, extra: Sequence[str] = ()) -> None:
        self._extra = tuple(re.compile(p) for p in extra)

    def kind(self, line: str) -> str | None:
        """``timestamp``, ``id`` or ``custom`` for a metadata line (stripped), else None."""
        for regex in self._extra:
            if regex.search(line):
                return "custom"
        m = _LINE.fullmatch(line)
        if m is None:
            return None
        value = m.group("value").strip()
        if m.group("time") is not None:
            label = m.group("time").lower()
            if label == "it" and not value[:1].isdigit() and not re.match(_WEEKDAY, value):
                return None  # "It is ..." states a time only when the value is one
            return "timestamp" if _WHEN_VALUE.fullmatch(value) else None
        return "id" if _ID_VALUE.fullmatch(value) else None


#: A line's kind (one of :data:`KINDS` but ``changed``) from its stripped text, or None:
#: :meth:`Detector.kind`, or a memo of it.
ClassifyLine = Callable[[str], str | None]


def fingerprints(texts: Sequence[str]) -> list[int]:
    """One fingerprint per line of ``texts`` (the system prompt's texts, in order), a
    separator between texts: ``hash(line)``, process-local; no text is kept."""
    out: list[int] = []
    for i, text in enumerate(texts):
        if i:
            out.append(hash(("\0text", i)))
        out.extend(hash(line) for line in text.split("\n"))
    return out


def plan(texts: Sequence[str], kind: ClassifyLine, changed: Collection[int] = ()) -> dict[str, Cut]:
    """The volatile lines to move out of ``texts`` (a system prompt's texts): for each text
    that loses lines, what is left of it and what left. ``kind``: a :class:`Detector`'s;
    ``changed``: fingerprints (:func:`fingerprints`) of lines seen to change. Empty when
    nothing moves, or when the candidates exceed :data:`MAX_LINES` or :data:`MAX_SHARE`."""
    size = sum(len(text) for text in texts)
    out: dict[str, Cut] = {}
    count = moved_chars = 0
    for text in dict.fromkeys(texts):  # a text given twice is planned once
        lines = text.split("\n")
        mine: dict[int, Moved] = {}
        for i, line in enumerate(lines):
            stripped = line.strip()
            if not stripped or len(stripped) > LINE_MAX:
                continue
            found = kind(stripped) or ("changed" if hash(line) in changed else None)
            if found is not None:
                mine[i] = Moved(line, found)
        if mine:  # where a line stands is read only for the few that could move
            alone = standalone(lines)
            mine = {i: m for i, m in mine.items() if alone[i]}
        if not mine:
            continue
        left = "\n".join(line for i, line in enumerate(lines) if i not in mine)
        if not left.strip():
            continue  # the whole text is metadata: it stays (an emptied text would go)
        out[text] = (left, tuple(mine.values()))
        times = texts.count(text)
        count += len(mine) * times
        moved_chars += sum(len(m.text) for m in mine.values()) * times
    if count > MAX_LINES or (moved_chars / MOVED_CHARS_PER_TOKEN
                             > MAX_SHARE * size / PROMPT_CHARS_PER_TOKEN):
        return {}
    return out
