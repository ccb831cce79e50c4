"""Long context split into units that coarse compression keeps or drops whole.

A unit is a slice of the context, byte for byte: a document ("Document [3](Title: ...) ...",
"[3] ...", "Passage 3: ..." up to the next marker, as retrieval prompts and
lost-in-the-middle's NQ prompts are written), else a section (a Markdown heading with the
text under it), a numbered or bulleted item, or a paragraph (blank lines between); a fenced
code block, an indented code block and a JSON value are units of their own, kept whole. A
JSON object or array of at least :data:`MIN_RECORDS` members (a list of records, a key-value
table) is the exception: each top-level member is a unit (kind ``record``), its brackets
stay, and what is left is still valid JSON.

Protected spans (:func:`protected_spans`: numbers, identifiers, URLs, inline code, quoted
strings such as JSON keys and values) are never cut: units end only at line ends or between
JSON members, and where a span would still cross a boundary the two units merge. Coarse
selection only keeps or drops whole units, so every span it keeps is kept byte for byte.

:func:`split` returns the layout: the context as fixed text (what the caller pinned, JSON
brackets, leading whitespace) and runs of droppable units; :func:`render` writes a chosen
subset back. Pure. Sources: LongLLMLingua (Jiang et al., ACL 2024) compresses at document
level first; lost-in-the-middle (Liu et al., TACL 2024) for the document format.
"""

from __future__ import annotations

import bisect
import itertools
import json
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

__all__ = ["MIN_RECORDS", "Layout", "Run", "Unit", "UnitKind", "protected_spans", "render",
           "split", "units_of"]

#: ``bracket``: a split JSON container's opening or closing bracket, never dropped.
UnitKind = Literal["document", "section", "item", "paragraph", "code", "json", "record", "bracket"]

#: A JSON object or array with at least this many top-level members is split into records.
MIN_RECORDS = 4

#: Runs of these kinds may be reordered; lists, code, JSON records and sections keep order.
_REORDERABLE = frozenset({"document", "paragraph"})

_DOC = re.compile(r"[ \t]*(?:(?:Document|Doc|Passage|Source|Result)[ \t]*\[?#?\d+\]?:?"
                  r"|\[\d+\])(?=[\s(:]|$)", re.IGNORECASE)
_FENCE = re.compile(r"[ \t]{0,3}(`{3,}|~{3,})")
_HEADING = re.compile(r"[ \t]{0,3}#{1,6}[ \t]+\S")
_ITEM = re.compile(r"[ \t]{0,3}(?:\d{1,3}[.)]|[-*+\u2022])[ \t]+\S")
_INDENTED = re.compile(r"(?: {4}|\t)")
_JSON_START = re.compile(r"[ \t]*[\[{]")
#: Quoted strings, inline code, URLs, then any word holding a digit, an underscore or an
#: inner capital (with the dots, commas, colons, slashes and hyphens inside it): numbers
#: (150,782, 3.14, 2024-05-15, 10:30), identifiers (snake_case, camelCase, dotted paths,
#: UUIDs, hex ids).
_PROTECTED = re.compile(
    r'"(?:[^"\\\n]|\\.)*"'
    r"|`(?:[^`\n]|\n(?![ \t]*\n))+`"
    r"|(?:https?://|www\.)[^\s<>\"')\]]+"
    r"|(?<!\w)[+-]?(?=[\w.,:/-]*(?:[\d_]|[a-z][A-Z]))\w(?:[\w.,:/-]*\w)?")
_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{},]')


@dataclass(frozen=True, slots=True)
class Unit:
    """One unit: ``text`` is ``context[start:start + len(text)]``, without surrounding
    whitespace; ``gap`` is what follows it up to the next unit (whitespace, or ``", "``
    between JSON records); ``label`` is the length of a document marker at its start
    ("Document [3]"), which ranking skips."""

    text: str
    start: int
    kind: UnitKind
    gap: str = ""
    label: int = 0

    @property
    def end(self) -> int:
        return self.start + len(self.text)

    @property
    def content(self) -> str:
        """The text without its document marker: what relevance is scored on."""
        return self.text[self.label:].lstrip()


@dataclass(frozen=True, slots=True)
class Run:
    """Consecutive droppable units. Kept units are joined by their own gaps, the last kept
    one by the run's last gap; ``reorderable`` runs (documents, paragraphs) may change
    order, the rest keep the context's order."""

    units: tuple[Unit, ...]
    reorderable: bool

    @property
    def sep(self) -> str:
        """The join put after the run's original last unit when it is no longer last: the
        run's most common gap between units."""
        gaps = Counter(u.gap for u in self.units[:-1])
        return gaps.most_common(1)[0][0] if gaps else "\n\n"


#: The context as fixed text and runs, in order: ``"".join`` of everything is the context.
Layout = tuple[str | Run, ...]


def protected_spans(text: str) -> list[tuple[int, int]]:
    """[start, end) character spans that must stay byte for byte, sorted, overlaps merged."""
    spans: list[tuple[int, int]] = []
    for m in _PROTECTED.finditer(text):
        start, end = m.span()
        if spans and start < spans[-1][1]:
            spans[-1] = (spans[-1][0], max(end, spans[-1][1]))
        else:
            spans.append((start, end))
    return spans


def split(context: str, pinned: Sequence[tuple[int, int]] = ()) -> Layout:
    """The context's layout. ``pinned``: [start, end) character spans the caller wants kept
    in place (an instruction, the question, content marked for caching); every unit they
    touch becomes fixed text."""
    units = _merge_across(context, _raw_units(context), protected_spans(context))
    units = [replace(u, gap=context[u.end:nxt.start])
             for u, nxt in zip(units, [*units[1:], Unit("", len(context), "paragraph")])]
    fixed = [u.kind == "bracket" or _touches(u, pinned) for u in units]
    parts: list[str | Run] = []
    head = units[0].start if units else len(context)
    if head:
        parts.append(context[:head])
    run: list[Unit] = []
    for unit, pin in zip(units, fixed):
        if pin or (run and _family(run[-1]) != _family(unit)):
            _close(parts, run)
            run = []
        if pin:
            _append_text(parts, unit.text + unit.gap)
        else:
            run.append(unit)
    _close(parts, run)
    return tuple(parts)


def units_of(layout: Layout) -> list[Unit]:
    """The droppable units, numbered in context order (the indices :func:`render` takes)."""
    return [u for part in layout if isinstance(part, Run) for u in part.units]


def render(layout: Layout, kept: Sequence[int],
           arrange: Callable[[list[int]], list[int]] | None = None,
           where: list[tuple[Unit, int]] | None = None) -> str:
    """The text keeping the units ``kept`` names (indices into :func:`units_of`, most
    relevant first): in each reorderable run in the order ``arrange`` gives that run's kept
    units (ranked), elsewhere and without ``arrange`` in context order; fixed text as it
    was. ``where``, when given, receives each kept unit and the character of the text
    returned where it starts."""
    rank = {index: position for position, index in enumerate(kept)}
    out: list[str] = []
    size = 0  # characters written so far, for ``where``
    base = 0
    for part in layout:
        if isinstance(part, str):
            out.append(part)
            size += len(part)
            continue
        mine = [i for i in range(base, base + len(part.units)) if i in rank]
        if part.reorderable and arrange is not None:
            mine = arrange(sorted(mine, key=rank.__getitem__))
        last = base + len(part.units) - 1
        for j, i in enumerate(mine):
            unit = part.units[i - base]
            if where is not None:
                where.append((unit, size))
            out.append(unit.text)
            if j + 1 == len(mine):
                out.append(part.units[-1].gap)
            else:
                out.append(part.sep if i == last else unit.gap)
            size += len(unit.text) + len(out[-1])
        base += len(part.units)
    return "".join(out)


def _raw_units(context: str) -> list[Unit]:
    """Units in context order (gaps not yet set): code fences and JSON blocks first, prose
    regions between them split by :func:`_prose`."""
    units: list[Unit] = []
    lines = context.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    region = 0  # first line of the prose region not yet split
    i = 0
    while i < len(lines):
        block = _fence(context, offsets, lines, i) or _json_block(context, offsets, i)
        if block is None:
            i += 1
            continue
        end_line, found = block
        units += _prose(context, offsets, region, i)
        units += found
        region = i = end_line
    units += _prose(context, offsets, region, len(lines))
    return units


def _fence(context: str, offsets: list[int], lines: list[str], i: int
           ) -> tuple[int, list[Unit]] | None:
    """A fenced code block opening on line ``i`` (to its closing fence, or the end)."""
    m = _FENCE.match(lines[i])
    if m is None:
        return None
    close = m.group(1)
    j = i + 1
    while j < len(lines) and not (lines[j].strip().startswith(close)
                                  and set(lines[j].strip()) == {close[0]}):
        j += 1
    end = min(j + 1, len(lines))
    return end, [_slice(context, offsets, i, end, "code", 0)]


def _json_block(context: str, offsets: list[int], i: int) -> tuple[int, list[Unit]] | None:
    """A JSON object or array starting line ``i`` and ending at a line end, or None."""
    line_start = offsets[i]
    m = _JSON_START.match(context, line_start, offsets[i + 1])
    if m is None:
        return None
    start = m.end() - 1
    try:
        value, end = json.JSONDecoder().raw_decode(context, start)
    except ValueError:
        return None
    line_end = context.find("\n", end)
    line_end = len(context) if line_end < 0 else line_end
    if context[end:line_end].strip():
        return None
    end_line = min(bisect.bisect_right(offsets, line_end), len(offsets) - 1)
    if isinstance(value, dict | list) and len(value) >= MIN_RECORDS:
        return end_line, _records(context, start, end)
    return end_line, [Unit(context[start:end], start, "json")]


def _records(context: str, start: int, end: int) -> list[Unit]:
    """The top-level members of the JSON container at [start, end), each a ``record``; its
    brackets become fixed ``bracket`` units (the whitespace inside them, gaps)."""
    cuts = [start + 1]  # where each member's stretch begins
    depth = 0
    for m in _JSON_TOKENS.finditer(context, start, end):
        token = m.group()
        if token in "[{":
            depth += 1
        elif token in "]}":
            depth -= 1
        elif token == "," and depth == 1:
            cuts.append(m.end())
    cuts.append(end - 1)
    units = [Unit(context[start], start, "bracket")]
    for a, b in itertools.pairwise(cuts):
        stretch = context[a:b]
        body = stretch.strip().removesuffix(",").rstrip()
        lead = len(stretch) - len(stretch.lstrip())
        units.append(Unit(body, a + lead, "record"))
    units.append(Unit(context[end - 1], end - 1, "bracket"))
    return units


def _prose(context: str, offsets: list[int], first: int, stop: int) -> list[Unit]:
    """Lines [first, stop) split into documents (when any line starts with a document
    marker: each runs to the next marker, blank lines and all, the last one to its first
    blank line), else sections, items, paragraphs and indented code."""
    markers = [k for k in range(first, stop) if _DOC.match(context, offsets[k], offsets[k + 1])]
    units: list[Unit] = []
    start = -1  # first line of the open unit, -1 when none is open
    kind: UnitKind = "paragraph"
    label = 0
    for k in range(first, stop):
        a, b = offsets[k], offsets[k + 1]
        marker = _DOC.match(context, a, b) if markers else None
        if marker is None and start >= 0 and kind == "document" and (
                k < markers[-1] or context[a:b].strip()):
            continue  # a document runs to the next marker; the last one to a blank line
        blank = not context[a:b].strip()
        heading = _HEADING.match(context, a, b) is not None
        item = _ITEM.match(context, a, b) is not None
        if marker is None and not blank and not heading and not item and start >= 0:
            if kind == "code" and not _INDENTED.match(context, a, b):
                kind = "paragraph"
            continue
        if start >= 0:
            units.append(_slice(context, offsets, start, k, kind, label))
        start, label = (-1, 0) if blank else (k, 0)
        if marker is not None:
            kind, label = "document", marker.end() - a
        elif not blank:
            kind = ("section" if heading else "item" if item else
                    "code" if _INDENTED.match(context, a, b) else "paragraph")
    if start >= 0:
        units.append(_slice(context, offsets, start, stop, kind, label))
    return _glue(context, [u for u in units if u.text])


def _slice(context: str, offsets: list[int], first: int, end: int, kind: UnitKind,
           label: int) -> Unit:
    a, b = offsets[first], offsets[end]
    text = context[a:b].rstrip()
    lead = len(text) - len(text.lstrip())
    if kind == "document":
        return Unit(text[lead:], a + lead, kind, label=label - lead)
    return Unit(text if kind == "code" else text[lead:], a if kind == "code" else a + lead,
                kind)


def _glue(context: str, units: list[Unit]) -> list[Unit]:
    """A heading alone joins what follows it; adjacent indented code blocks join up."""
    out: list[Unit] = []
    for unit in units:
        prev = out[-1] if out else None
        if prev is not None and (
                (prev.kind == "section" and "\n" not in prev.text
                 and unit.kind not in ("section", "document"))
                or (prev.kind == unit.kind == "code")):
            out[-1] = Unit(context[prev.start:unit.end], prev.start, prev.kind)
        else:
            out.append(unit)
    return out


def _merge_across(context: str, units: list[Unit], spans: list[tuple[int, int]]
                  ) -> list[Unit]:
    """Neighbours that a protected span crosses become one unit (a span can cross a
    boundary only where units meet at a single line break: items, document markers)."""
    out = list(units)
    starts = [u.start for u in out]
    for s, e in spans:
        a = bisect.bisect_right(starts, s) - 1
        b = bisect.bisect_right(starts, e - 1) - 1
        if a < 0 or a == b or out[a].end <= s or "bracket" in (out[a].kind, out[b].kind):
            continue
        first, last = out[a], out[b]
        out[a:b + 1] = [Unit(context[first.start:last.end], first.start, first.kind,
                             label=first.label)]
        del starts[a + 1:b + 1]
    return out


def _touches(unit: Unit, pinned: Sequence[tuple[int, int]]) -> bool:
    return any(s < unit.end and e > unit.start for s, e in pinned)


def _family(unit: Unit) -> str:
    return "record" if unit.kind == "record" else "prose"


def _close(parts: list[str | Run], run: list[Unit]) -> None:
    if run:
        parts.append(Run(tuple(run), all(u.kind in _REORDERABLE for u in run)))


def _append_text(parts: list[str | Run], text: str) -> None:
    if parts and isinstance(parts[-1], str):
        parts[-1] += text
    else:
        parts.append(text)
