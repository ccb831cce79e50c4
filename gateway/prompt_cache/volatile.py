"""Volatile spans: what changes from one request to the next inside otherwise stable text.

A timestamp in a system prompt makes every request's prefix new, and the provider's prompt
cache never hits (Anthropic and OpenAI reuse byte-identical prefixes only). :class:`Detector`
finds such spans by pattern: ISO 8601 and common date and time formats, weekday and month
names with a date, epoch timestamps, UUIDs, request and hex ids, counters ("request #123"),
and the policy's own ``patterns``. :func:`scan` takes them out of a text, keeping what is
left byte-stable:

- a short line holding a span (at most :data:`LINE_MAX` characters) leaves whole: the
  note reads as the line did, and nothing is left in its place;
- in a longer line, the sentence around the span leaves (at most :data:`SENTENCE_MAX`
  characters), or else the span alone, replaced by a placeholder ``[note N]`` (N counts
  within the text) that the note names.

Lines found to change by comparison with recent requests (:mod:`gateway.prompt_cache.memory`)
leave whole too (:func:`take_lines`, kind ``changed``). What leaves is a :class:`Moved`; the
caller puts it at the end of the request (:mod:`gateway.prompt_cache.relocate`). Pure.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

__all__ = ["KINDS", "LINE_MAX", "SENTENCE_MAX", "Detector", "Moved", "Scan", "line_hashes",
           "scan", "take_lines"]

#: The kinds of moved spans, as the log line counts them: ``timestamp`` (dates, times,
#: epoch seconds or ms), ``uuid``, ``id`` (request, session, hex and prefixed ids),
#: ``counter``, ``custom`` (the policy's patterns), ``changed`` (a line seen to change).
KINDS = ("timestamp", "uuid", "id", "counter", "custom", "changed")

#: A line holding a span leaves whole when it is at most this long (characters, stripped).
LINE_MAX = 200
#: Else the sentence around the span leaves when it is at most this long.
SENTENCE_MAX = 240

_S = r"[ \t]"  # spaces within a line: a span never crosses one
_MONTH = (r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
          r"|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)")
_WEEKDAY = r"(?:Mon|Tue(?:s)?|Wed(?:nes)?|Thu(?:rs?)?|Fri|Sat(?:ur)?|Sun)(?:day)?\.?"
_ZONE = rf"(?:{_S}?(?:Z|UTC|GMT|[+-]\d{{2}}(?::?\d{{2}})?|[A-Z]{{2,4}}T?)(?![A-Za-z]))?"
_TIME = (rf"\d{{1,2}}:\d{{2}}(?::\d{{2}}(?:[.,]\d{{1,9}})?)?"
         rf"(?:{_S}?(?:[AaPp]\.[Mm]\.|[AaPp][Mm]\b))?{_ZONE}")
_AT_TIME = rf"(?:,?{_S}+(?:at{_S}+)?{_TIME})?"
_ORDINAL = r"(?:st|nd|rd|th)?"
_YEAR = rf"(?:,?{_S}+\d{{4}})?"

#: (kind, regex) tried left to right at each position; dates before the times inside them.
BUILTIN: tuple[tuple[str, str], ...] = (
    ("uuid", r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"),
    # ISO 8601: 2024-05-15, 2024-05-15T15:00:00Z, 2024-05-15 15:00:00.123 EST
    ("timestamp", rf"\b\d{{4}}-\d{{2}}-\d{{2}}(?:(?:T|{_S}+){_TIME})?"),
    # 05/15/2024, 15.05.2024, 2024/05/15, optionally with a time
    ("timestamp", (rf"\b(?:\d{{1,2}}/\d{{1,2}}/\d{{2,4}}|\d{{1,2}}\.\d{{1,2}}\.\d{{4}}"
                   rf"|\d{{4}}/\d{{2}}/\d{{2}})\b{_AT_TIME}")),
    # [Wednesday,] May 15[th][, 2024] | 15 May [2024] | May 2024, optionally at a time
    ("timestamp", (rf"\b(?:{_WEEKDAY},?{_S}+)?(?:{_MONTH}\.?{_S}+\d{{1,2}}{_ORDINAL}\b{_YEAR}"
                   rf"|\d{{1,2}}{_ORDINAL}{_S}+{_MONTH}\b\.?{_YEAR}|{_MONTH}\.?{_S}+\d{{4}})"
                   rf"\b{_AT_TIME}")),
    ("timestamp", (rf"(?i:\b(?:today|it){_S}+is{_S}+)(?:Mon|Tues|Wednes|Thurs|Fri|Satur|Sun)day"
                   r"\b")),
    ("timestamp", rf"\b{_TIME}|\b\d{{1,2}}{_S}?(?:am|pm|AM|PM)\b"),
    # epoch seconds (2017..2033) or milliseconds
    ("timestamp", r"\b1[5-9]\d{8}(?:\d{3})?\b"),
    # req_01HX..., call_abc123, msg-9f8e7d...: a known prefix and a token with a digit
    ("id", (r"\b(?:req|request|msg|chatcmpl|call|run|sess|session|trace|span|toolu|evt|txn"
            r"|conv|thread|job)[-_](?=[A-Za-z0-9]*\d)[A-Za-z0-9]{6,}\b")),
    # request id: 7f3a9c..., Session-ID=abc123
    ("id", (rf"(?i:\b(?:request|session|trace|correlation|conversation|run|span|transaction)"
            rf"[ _-]?id\b){_S}*[:=#]?{_S}*(?=[\w.-]*\d)[\w.-]{{4,}}")),
    # hex ids of 12+ digits with both letters and digits (trace ids, hashes)
    ("id", r"\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{12,}\b"),
    # request #123, Requests: 42, turn 7
    ("counter", rf"\b[A-Za-z]+{_S}?#\d+\b"),
    ("counter", (rf"(?i:\b(?:requests?|turns?|messages?|calls?|iterations?|attempts?|visits?"
                 rf"|queries)(?:{_S}*(?:count|number|no\.?|num))?{_S}*[:=]{_S}*)\d+\b")),
    ("counter", rf"(?i:\b(?:request|turn|iteration|attempt){_S}+(?:number{_S}+)?)\d+\b"),
)

_SENTENCE_END = re.compile(r"[.!?]+(?=\s)")


@dataclass(frozen=True, slots=True)
class Moved:
    """What left a text: ``text`` (a line, a sentence or a span), the ``kinds`` of the spans
    it held, and ``label`` when a placeholder ``[note N]`` stands in its place."""

    text: str
    kinds: tuple[str, ...]
    label: int | None = None


@dataclass(frozen=True, slots=True)
class Scan:
    """A text after :func:`scan`: its remaining ``lines`` (joined with ``\\n`` they are the
    new text) and what was ``moved``, in order."""

    lines: tuple[str, ...]
    moved: tuple[Moved, ...]


class Detector:
    """Finds volatile spans: the built-in patterns (:data:`BUILTIN`) and ``extra`` regexes
    (the policy's ``patterns``, kind ``custom``). Raises ``re.error`` for a bad regex.

    Every built-in span holds a digit or a weekday's name, so the built-in patterns are
    tried only where a span holding one may start (a regex of 14 alternatives run at every
    position costs ~0.5 us a character: 3 ms for a 6 KB system prompt).
    The ``extra`` regexes run over the whole text: keep them simple.
    """

    __slots__ = ("_builtin", "_extra", "_kinds")

    def __init__(self, extra: Sequence[str] = (), builtin: bool = True) -> None:
        table = BUILTIN if builtin else ()
        self._kinds = [kind for kind, _ in table]
        # One capturing group per pattern (the patterns have none of their own): the
        # group that matched names the kind.
        self._builtin = re.compile("|".join(f"({regex})" for _, regex in table)) \
            if table else None
        self._extra = tuple(re.compile(p) for p in extra)

    def spans(self, text: str) -> list[tuple[int, int, str]]:
        """Non-overlapping ``(start, end, kind)`` in order; an empty match counts not."""
        found = self._builtin_spans(text) if self._builtin is not None else []
        if self._extra:
            for regex in self._extra:
                found.extend((m.start(), m.end(), "custom") for m in regex.finditer(text)
                             if m.end() > m.start())
            found.sort(key=lambda span: (span[0], -span[1]))
            merged: list[tuple[int, int, str]] = []
            for span in found:  # the first of overlapping spans wins
                if merged and span[0] < merged[-1][1]:
                    continue
                merged.append(span)
            found = merged
        return found

    def _builtin_spans(self, text: str) -> list[tuple[int, int, str]]:
        assert self._builtin is not None
        match, kinds = self._builtin.match, self._kinds
        found: list[tuple[int, int, str]] = []
        done = 0  # anchors before this offset are inside a span already
        for anchor in _anchors(text):
            if anchor < done:
                continue
            for start in _starts(text, anchor, done):  # the farthest first: longest wins
                m = match(text, start)
                if m is not None and m.end() > anchor:
                    found.append((start, m.end(), kinds[(m.lastindex or 1) - 1]))
                    done = m.end()
                    break
        return found


#: Words a span may begin with before its digit or weekday ("May 15", "request #1",
#: "Request id: 7f3a", "today is Monday"), lower case; other words are never tried.
_LEAD = frozenset({
    "jan", "january", "feb", "february", "mar", "march", "apr", "april", "may", "jun",
    "june", "jul", "july", "aug", "august", "sep", "sept", "september", "oct", "october",
    "nov", "november", "dec", "december", "today", "it", "id", "request", "requests",
    "session", "trace", "correlation", "conversation", "run", "span", "transaction", "turn",
    "turns", "message", "messages", "call", "calls", "iteration", "iterations", "attempt",
    "attempts", "visit", "visits", "queries", "count", "number", "no", "num",
    "request_id", "session_id", "trace_id", "correlation_id", "conversation_id", "run_id",
    "span_id", "transaction_id"})
_SEPARATORS = " \t:=#,.-"
_DIGITS = re.compile(r"[0-9]+")
_NOT_DIGIT = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
_WEEKDAYS = ("Mon", "Tues", "Wednes", "Thurs", "Fri", "Satur", "Sun")


def _starts(text: str, anchor: int, done: int) -> list[int]:
    """Where a span holding ``anchor`` may start, the farthest first: the start of the word
    holding it, and up to two words before when they may lead a span (:data:`_LEAD`, or a
    word followed by ``#``). Never before ``done``."""
    j = anchor
    while j > done and (text[j - 1].isalnum() or text[j - 1] == "_"):
        j -= 1
    starts = [j]
    end = j
    for _ in range(2):
        s = end
        while s > done and end - s < 3 and text[s - 1] in _SEPARATORS:
            s -= 1
        if s == end:
            break
        e = s
        while s > done and (text[s - 1].isalnum() or text[s - 1] == "_"):
            s -= 1
        if s == e:
            break
        if text[s:e].lower() in _LEAD or "#" in text[e:end]:
            starts.insert(0, s)
        end = s
    return starts


def _anchors(text: str) -> list[int]:
    """Offsets of digit runs and weekday names, in order. ASCII text is searched as bytes
    with ``bytes.find`` (memchr speed); other text with a regex."""
    anchors: list[int] = []
    if text.isascii():
        digits = text.encode().translate(_NOT_DIGIT)  # digits stay "0", the rest " "
        find = digits.find
        i = find(b"0")
        while i >= 0:
            anchors.append(i)
            end = find(b" ", i)
            if end < 0:
                break
            i = find(b"0", end)
    else:
        anchors = [m.start() for m in _DIGITS.finditer(text)]
    i = text.find("day")
    weekdays = []
    while i >= 0:
        for stem in _WEEKDAYS:
            if text.startswith(stem, i - len(stem)):
                weekdays.append(i - len(stem))
                break
        i = text.find("day", i + 3)
    if weekdays:
        anchors = sorted(anchors + weekdays)
    return anchors


def scan(text: str, detector: Detector) -> Scan:
    """``text`` without its volatile spans (rules in the module docstring)."""
    spans = detector.spans(text)
    lines = text.split("\n")
    if not spans:
        return Scan(tuple(lines), ())
    kept: list[str] = []
    moved: list[Moved] = []
    label = 0
    start = i = 0
    for line in lines:
        end = start + len(line)
        mine: list[tuple[int, int, str]] = []
        while i < len(spans) and spans[i][0] < end + 1:
            s, e, kind = spans[i]
            mine.append((s - start, min(e, end) - start, kind))
            i += 1
        start = end + 1
        if not mine:
            kept.append(line)
            continue
        if len(line.strip()) <= LINE_MAX:
            moved.append(Moved(line.strip(), tuple(k for _, _, k in mine)))
            continue
        line, label = _cut(line, mine, moved, label)
        kept.append(line)
    return Scan(tuple(kept), tuple(moved))


def _cut(line: str, spans: list[tuple[int, int, str]], moved: list[Moved],
         label: int) -> tuple[str, int]:
    """A long line without its spans: each span's sentence leaves when short enough, else
    the span leaves and ``[note N]`` takes its place. Returns the line and the last N."""
    ends = [m.end() for m in _SENTENCE_END.finditer(line)]
    cuts: list[tuple[int, int, Moved, str]] = []  # (start, end, what left, replacement)
    for s, e, kind in spans:
        if cuts and s < cuts[-1][1]:  # in the sentence already cut: one more kind
            a, b, m, r = cuts[-1]
            cuts[-1] = (a, b, Moved(m.text, (*m.kinds, kind), m.label), r)
            continue
        first = max((b for b in ends if b <= s), default=0)
        last = min((b for b in ends if b >= e), default=len(line))
        sentence = line[first:last].strip()
        if len(sentence) <= SENTENCE_MAX:
            cuts.append((first, last, Moved(sentence, (kind,)), ""))
        else:
            label += 1
            cuts.append((s, e, Moved(line[s:e], (kind,), label), f"[note {label}]"))
    out: list[str] = []
    at = 0
    for s, e, m, replacement in cuts:
        piece = line[at:s]
        if not replacement:  # a sentence left: keep one space between its neighbours
            piece = piece.rstrip()
            e += len(line[e:]) - len(line[e:].lstrip())
            if piece and e < len(line):
                piece += " "
        out.append(piece + replacement)
        moved.append(m)
        at = e
    out.append(line[at:])
    return "".join(out), label


def line_hashes(source: str, lines: Sequence[str]) -> list[int]:
    """Fingerprints of a text's non-blank lines: ``hash((source, line))`` (process-local;
    no text is kept)."""
    return [hash((source, line)) for line in lines if line.strip()]


def take_lines(source: str, lines: Sequence[str], flagged: Collection[int]
               ) -> tuple[list[str], list[Moved]]:
    """``lines`` without those whose fingerprint is in ``flagged`` (kind ``changed``)."""
    kept: list[str] = []
    moved: list[Moved] = []
    for line in lines:
        if line.strip() and hash((source, line)) in flagged:
            moved.append(Moved(line.strip(), ("changed",)))
        else:
            kept.append(line)
    return kept, moved
