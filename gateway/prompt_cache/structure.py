"""Which lines of a system prompt stand on their own, outside any structure.

The prompt_cache stage may move a volatile line out of a system prompt only when the line
is a statement of its own ("Current date: 2024-05-15"), never a line that belongs to
something larger: a document the client pasted, a list, a table, code or data. Moving such
a line would tear it out of what gives it meaning (a passage's date, a list's third item,
a JSON value). :func:`standalone` marks, for each line, whether it stands on its own; a
line does not when it is, or is inside:

- a fenced code block (```` ``` ```` or ``~~~``, the fences included; unclosed: to the end);
- an indented line (any leading space or tab: indented code, a list item's continuation);
- a list item (``- x``, ``* x``, ``+ x``, ``• x``, ``1. x``, ``2) x``, ``a) x``, ``(i) x``);
- a table row (starts with ``|``, holds two ``|`` or a tab);
- a quoted line (``> x``);
- a JSON or other bracketed block: a line starting with a bracket or a quote, and every line
  while ``{``/``[`` opened on earlier lines are not closed;
- an XML/HTML-tagged section: a line holding a tag, and every line inside an open tag;
- a document or passage: the paragraph (lines up to a blank line) holding a line that
  starts with a document marker (``Document [3]``, ``[3]``, ``Passage 2:``, ``Source 1``,
  ``Result 4``, ``Title:``), as retrieval prompts write them (lost-in-the-middle, Liu et
  al., TACL 2024).

When in doubt a line is structure: a false "structure" costs a cache miss, a false
"standalone" could change what the request means. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["standalone"]

_FENCE = re.compile(r"[ \t]*(`{3,}|~{3,})")
_ITEM = re.compile(r"(?:[-*+\u2022\u2023\u25e6]|\d{1,3}[.)]|[A-Za-z][.)]|\(\w{1,4}\))(?:[ \t]|$)")
_DOCUMENT = re.compile(r"(?:(?:Document|Doc|Passage|Source|Result|Article|Snippet)[ \t]*\[?#?\d+\]?"
                       r"|\[\d+\]|Title[ \t]*:)", re.IGNORECASE)
_TAG = re.compile(r"</?[A-Za-z][\w:.-]*(?:\s[^<>]*)?/?>")
_OPEN_TAG = re.compile(r"<([A-Za-z][\w:.-]*)(?:\s[^<>]*)?(?<!/)>")
_CLOSE_TAG = re.compile(r"</([A-Za-z][\w:.-]*)\s*>")
_BRACKET = re.compile(r"[{}\[\]]")


def standalone(lines: Sequence[str]) -> list[bool]:
    """For each of ``lines`` (a text split on ``"\\n"``), whether it stands on its own
    (rules in the module docstring). Blank lines count as standing on their own."""
    out = [True] * len(lines)
    fence: str | None = None  # the open fence's marker
    depth = 0  # brackets opened on earlier lines and not yet closed
    tags: list[str] = []  # open tags, innermost last
    paragraph = 0  # where the current paragraph starts
    document = False  # the current paragraph holds a document marker
    for i, line in enumerate(lines):
        text = line.strip()
        if not text:
            if document:
                out[paragraph:i] = [False] * (i - paragraph)
            paragraph, document = i + 1, False
            continue
        if fence is not None:
            out[i] = False
            if text.startswith(fence):
                fence = None
            continue
        first = text[0]
        if first in "`~":
            opened = _FENCE.match(line)
            if opened:
                out[i] = False
                fence = opened.group(1)
                continue
        inside = depth > 0 or bool(tags)
        if _BRACKET.search(text):
            depth = max(0, depth + _brackets(text))
        tagged = "<" in text and _track_tags(text, tags)
        if not document and (first in "[DdPpSsRrAaTt") and _DOCUMENT.match(text):
            document = True
        if (inside or tagged or line[0] in " \t" or first in "{}[]\"'>|"
                or _ITEM.match(text)
                or "\t" in text or text.count("|") >= 2):
            out[i] = False
    if document:
        out[paragraph:] = [False] * (len(lines) - paragraph)
    return out


def _brackets(text: str) -> int:
    """Brackets a line leaves open (negative: closes), outside quoted strings."""
    if '"' not in text:
        return (text.count("{") + text.count("[")) - (text.count("}") + text.count("]"))
    net = 0
    quoted = False
    escaped = False
    for c in text:
        if escaped:
            escaped = False
        elif c == "\\":
            escaped = True
        elif c == '"':
            quoted = not quoted
        elif not quoted:
            if c in "{[":
                net += 1
            elif c in "}]":
                net -= 1
    return net


def _track_tags(text: str, tags: list[str]) -> bool:
    """Updates the open ``tags`` with a line's tags; True when the line holds one."""
    if not _TAG.search(text):
        return False
    events = sorted([(m.start(), m.group(1), True) for m in _OPEN_TAG.finditer(text)]
                    + [(m.start(), m.group(1), False) for m in _CLOSE_TAG.finditer(text)])
    for _, name, opening in events:
        if opening:
            tags.append(name)
        elif name in tags:
            del tags[len(tags) - 1 - tags[::-1].index(name):]
    return True
