"""Which lines of a system prompt the prompt_cache stage may move, judged by the test's own
reading of the text (written independently of ``gateway/prompt_cache``).

- :func:`is_metadata`: a whole line of a known metadata shape with a date, time or id value:
  "Current date: 2024-05-15", "Today is Wednesday, May 15, 2024.", "The current time is
  2024-05-15 15:00:00 EST.", "Request ID: 7f3a...", "Session id: abc123".
- :func:`enclosed`: the lines that may never move whatever they hold: inside a fenced code
  block, a list item, a table row, a JSON block, an XML/HTML-tagged section, an indented
  line, or a document/passage paragraph ("Document [3](Title: ...) ...").
"""

from __future__ import annotations

import json
import re

__all__ = ["MAX_LINE", "enclosed", "is_metadata"]

#: A moved line, stripped, is at most this many characters.
MAX_LINE = 160

_MONTH = (r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
          r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\.?")
_WHEN = re.compile(
    r"\d{4}-\d{2}-\d{2}"  # ISO date
    r"|\d{1,2}:\d{2}"  # clock time
    r"|\d{1,2}/\d{1,2}/\d{2,4}"  # 5/15/2024
    rf"|\b{_MONTH}\s+\d{{1,2}}\b|\b\d{{1,2}}(?:st|nd|rd|th)?\s+(?:of\s+)?{_MONTH}"
    r"|\b\d{10,13}\b",  # epoch seconds or milliseconds
    re.IGNORECASE)
_CLOCK_LINE = re.compile(
    r"(?:(?:the\s+)?(?:current|today'?s)\s+(?:date\s+and\s+time|date|time|datetime"
    r"|timestamp)\s*(?:is\b|:)"
    r"|today\s+is\b|it\s+is\s+now\b|now\s*:|(?:date|time|timestamp)\s*:)\s*(?P<value>.+)",
    re.IGNORECASE)
_ID_LINE = re.compile(
    r"(?:request|session|trace|conversation|correlation|run)[ _-]?id\s*(?:is\b|:)\s*"
    r"(?P<value>[A-Za-z0-9][A-Za-z0-9_.:-]{5,})\.?",
    re.IGNORECASE)

_FENCE = re.compile(r"\s*(`{3,}|~{3,})")
_ITEM = re.compile(r"\s*(?:[-*+\u2022]|\d{1,3}[.)])\s+\S")
_DOCUMENT = re.compile(r"\s*(?:(?:document|doc|passage|source|result)\s*\[?#?\d+\]?|\[\d+\])",
                       re.IGNORECASE)
_TAG = re.compile(r"<(/?)([A-Za-z][\w:.-]*)(?:\s[^<>]*)?>")


def is_metadata(line: str) -> bool:
    """Whether ``line`` (one line, stripped here) is a clock, date or id line."""
    text = line.strip()
    if not text or len(text) > MAX_LINE:
        return False
    if _ID_LINE.fullmatch(text):
        return True
    m = _CLOCK_LINE.fullmatch(text)
    return m is not None and _WHEN.search(m.group("value")) is not None


def enclosed(text: str) -> set[int]:
    """Indices (into ``text.split("\\n")``) of the lines inside a structure."""
    lines = text.split("\n")
    out: set[int] = set()
    fence: str | None = None
    paragraph: str | None = None  # "item" or "document" while in such a paragraph
    json_until = -1
    for i, line in enumerate(lines):
        if fence is not None:
            out.add(i)
            if line.strip().startswith(fence) and set(line.strip()) == {fence[0]}:
                fence = None
            continue
        if i <= json_until:
            out.add(i)
            continue
        if not line.strip():
            paragraph = None
            continue
        m = _FENCE.match(line)
        if m is not None:
            fence = m.group(1)
            out.add(i)
            continue
        if line.lstrip()[:1] in ("{", "["):
            json_until = _json_end(lines, i)
            if json_until >= i:
                out.add(i)
                continue
        if _ITEM.match(line):
            paragraph = "item"
        elif _DOCUMENT.match(line):
            paragraph = "document"
        if paragraph is not None or line[:1] in (" ", "\t") or _table_row(line):
            out.add(i)
    return out | _tagged(lines)


def _table_row(line: str) -> bool:
    text = line.strip()
    return text.startswith("|") or text.endswith("|") or text.count("|") >= 2


def _json_end(lines: list[str], i: int) -> int:
    """The last line of a JSON value starting on line ``i`` (its first non-blank
    character); up to the next blank line when it does not parse; -1 for a lone bracket
    that starts nothing ("[1] ..." is a document marker, handled elsewhere)."""
    rest = "\n".join(lines[i:])
    start = len(rest) - len(rest.lstrip())
    try:
        _, end = json.JSONDecoder().raw_decode(rest, start)
    except ValueError:
        if _DOCUMENT.match(lines[i]):
            return -1
        j = i
        while j + 1 < len(lines) and lines[j + 1].strip():
            j += 1
        return j
    return i + rest.count("\n", 0, end)


def _tagged(lines: list[str]) -> set[int]:
    """Lines of XML/HTML-tagged sections: from an opening tag to its matching closing tag
    (an opening tag that is never closed encloses only its own line)."""
    text = "\n".join(lines)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)

    def line_of(offset: int) -> int:
        lo, hi = 0, len(lines) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if starts[mid] <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo

    out: set[int] = set()
    tags = list(_TAG.finditer(text))
    for n, tag in enumerate(tags):
        first = line_of(tag.start())
        out.add(first)
        if tag.group(1) or tag.group(0).endswith("/>"):
            continue
        depth = 0
        for later in tags[n + 1:]:
            if later.group(2) != tag.group(2):
                continue
            depth += -1 if later.group(1) else 1
            if depth < 0:
                out.update(range(first, line_of(later.start()) + 1))
                break
    return out
