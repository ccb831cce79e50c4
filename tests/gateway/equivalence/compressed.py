"""The compress stage's contract on one text, checked on its own terms (independently of
``gateway/compression`` as far as a reading of the README allows):

- nothing is added: every line of the compressed text is a line of the original (each used
  at most as often as the original has it; blank lines and the whitespace around a line
  aside), except JSON values starting a line, which must parse and be a sub-value of a JSON
  value of the original (an object: some of its members, each with an identical value; an
  array: some of its elements);
- units (documents, paragraphs, records) are kept whole or dropped, and documents may be
  reordered (README: "the most relevant written at both ends");
- for the request text (the newest user message's last text) the instruction (its first
  lines, up to the first blank line or structure) and the question (its last lines, back to
  the last blank line or document) are byte-exact and in place: the compressed text starts
  with the one and ends with the other.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

from tests.gateway.equivalence.diff import first_difference, shorten

__all__ = ["check_compressed", "request_ends"]

#: A first or last unit longer than this (characters) is context, not the request.
MAX_REQUEST = 2000

_STRUCTURE = re.compile(
    r"\s*(?:(?:document|doc|passage|source|result)\s*\[?#?\d+\]?|\[\d+\]"  # documents
    r"|[\[{]|`{3}|~{3}|#{1,6}\s|(?:[-*+\u2022]|\d{1,3}[.)])\s)",  # JSON, code, headings, lists
    re.IGNORECASE)


def request_ends(text: str) -> tuple[str, str]:
    """(instruction, question) of a request text: its leading prose lines up to the first
    blank or structured line, and its trailing prose lines back to the last one; "" where
    the text has none or they are longer than :data:`MAX_REQUEST`. A text that is prose
    throughout (one unit) has no context to compress: both are the whole text."""
    lines = text.split("\n")
    head: list[str] = []
    for line in lines:
        if not line.strip() or _STRUCTURE.match(line):
            break
        head.append(line)
    tail: list[str] = []
    for line in reversed(lines):
        if not line.strip() or _STRUCTURE.match(line):
            break
        tail.insert(0, line)
    instruction, question = "\n".join(head), "\n".join(tail)
    if len(head) == len(lines):
        return text, text
    return (instruction if len(instruction) <= MAX_REQUEST else "",
            question if len(question) <= MAX_REQUEST else "")


def check_compressed(original: str, compressed: str, request: bool) -> str | None:
    """None when ``compressed`` keeps the contract, else what breaks it."""
    if request:
        instruction, question = request_ends(original)
        if instruction and not compressed.startswith(instruction):
            return (f"the instruction {shorten(instruction, 80)} is not kept at the start: "
                    f"the text starts {shorten(compressed[:80])}")
        if question and not compressed.endswith(question):
            return (f"the question {shorten(question, 80)} is not kept at the end: "
                    f"the text ends {shorten(compressed[-80:])}")
    values = _json_values(original)
    left = Counter(line.strip() for line in original.split("\n") if line.strip())
    lines = compressed.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        found = _json_at(lines, i)
        if found is not None:
            value, last = found
            if not any(_within(value, whole) for whole in values):
                return (f"compressed line {i + 1}: the JSON value {shorten(value)} is not "
                        "part of any JSON value of the original")
            i = last + 1
            continue
        if line.strip():
            if left[line.strip()] <= 0:
                seen = "more often than in" if line.strip() in original else "not in"
                return f"compressed line {i + 1} is {seen} the original: {shorten(line)}"
            left[line.strip()] -= 1
        i += 1
    return None


def _json_at(lines: list[str], i: int) -> tuple[Any, int] | None:
    """The JSON object or array starting line ``i`` and ending a line: (value, last line)."""
    if lines[i].lstrip()[:1] not in ("{", "["):
        return None
    rest = "\n".join(lines[i:])
    start = len(rest) - len(rest.lstrip())
    try:
        value, end = json.JSONDecoder().raw_decode(rest, start)
    except ValueError:
        return None
    line_end = rest.find("\n", end)
    if rest[end:line_end if line_end >= 0 else len(rest)].strip():
        return None
    return value, i + rest.count("\n", 0, end)


def _json_values(text: str) -> list[Any]:
    lines = text.split("\n")
    out = []
    for i in range(len(lines)):
        found = _json_at(lines, i)
        if found is not None:
            out.append(found[0])
    return out


def _within(part: Any, whole: Any) -> bool:
    """``part`` is ``whole`` with some members (object) or elements (array) left out."""
    if isinstance(part, dict) and isinstance(whole, dict):
        return all(k in whole and first_difference(whole[k], v) is None
                   for k, v in part.items())
    if isinstance(part, list) and isinstance(whole, list):
        pool = [json.dumps(v, sort_keys=True) for v in whole]
        for value in part:
            key = json.dumps(value, sort_keys=True)
            if key not in pool:
                return False
            pool.remove(key)
        return True
    return False
