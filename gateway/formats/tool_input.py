"""A custom (freeform) tool offered to an upstream that knows only functions: the function
it becomes, and the text a call of it carries, whole or as it streams. Pure, no I/O.

A custom tool takes free text (``{"type": "custom", "name", "description", "format"}``,
``format`` ``{"type": "text"}`` or a grammar ``{"type": "grammar", "syntax": "lark" |
"regex", "definition"}``); a function takes a JSON object. So the function takes one
string, ``input`` (:func:`input_schema`), its description telling the grammar when there is
one (the upstream cannot enforce it: the model is told it), and a call's arguments
``{"input": "..."}`` give the text back: :func:`custom_input` for a whole call,
:class:`InputStream` for one streamed (the text's pieces as the arguments' pieces come,
without waiting for the end).

Sources: https://platform.openai.com/docs/guides/function-calling#custom-tools, the openai
SDK's ``CustomTool`` and ``ResponseCustomToolCallInputDeltaEvent``.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["InputStream", "custom_description", "custom_input", "input_schema"]

def input_schema() -> dict[str, Any]:
    """The parameters of the function a custom tool is offered as (a new dict each time:
    what is sent may be reshaped further on)."""
    return {"type": "object", "properties": {"input": {
        "type": "string", "description": "The tool's whole input, as free text."}},
        "required": ["input"], "additionalProperties": False}

_GRAMMAR = {"lark": "The input must be written in this Lark grammar:",
            "regex": "The input must match this regular expression:"}


def custom_description(description: str | None, fmt: dict[str, Any] | None) -> str:
    """The function's description: the tool's, then its grammar (``fmt`` a checked
    ``grammar`` format; None or ``text``: nothing added)."""
    text = description or ""
    if fmt is None or fmt.get("type") != "grammar":
        return text
    lead = _GRAMMAR.get(fmt["syntax"], f"The input must follow this {fmt['syntax']} grammar:")
    return f"{text}\n\n{lead}\n{fmt['definition']}" if text else f"{lead}\n{fmt['definition']}"


def _clean(text: str) -> str:
    """``text`` as valid UTF-8 (a lone surrogate, which a JSON escape can make, as "?")."""
    return text if text.isascii() else text.encode("utf-8", "replace").decode("utf-8")


def custom_input(arguments: str) -> str:
    """The text of a call whose ``arguments`` the upstream wrote: ``input`` of the JSON
    object (or its one string, under another key), a JSON string's value, else the
    arguments as they came (a model that wrote the text itself). Control characters inside
    the JSON's strings are read as they are (as models write them)."""
    try:
        value = json.loads(arguments, strict=False)
    except (ValueError, RecursionError):
        return arguments
    if isinstance(value, dict):
        text = value.get("input")
        if not isinstance(text, str) and len(value) == 1:
            text = next(iter(value.values()))
        if isinstance(text, str):
            return _clean(text)
    elif isinstance(value, str):
        return _clean(value)
    return arguments


_OPENING = '{"input":"'
_SPECIAL = re.compile(r'["\\]')
_HIGH = re.compile(r"[dD][89abAB][0-9a-fA-F]{2}")


def _decodable(raw: str) -> tuple[int, bool]:
    """How much of ``raw`` (a JSON string's content, without its opening quote) can be
    decoded now: up to its closing quote (then True), else up to any escape still cut."""
    at, n = 0, len(raw)
    while True:
        found = _SPECIAL.search(raw, at)
        if found is None:
            return n, False
        at = found.start()
        if raw[at] == '"':
            return at, True
        if at + 1 >= n:
            return at, False
        if raw[at + 1] != "u":
            at += 2
            continue
        if at + 6 > n:
            return at, False
        if _HIGH.fullmatch(raw, at + 2, at + 6) and "\\u".startswith(raw[at + 6:at + 8]):
            if at + 12 > n:  # the first half of a pair (maybe): decoded with its second
                return at, False
            at += 12
        else:
            at += 6


class InputStream:
    """The text of a streamed call's arguments, as they come: :meth:`feed` each piece of
    the arguments, get the text's new piece (``""`` while none is certain). Only arguments
    that open as ``{"input": "`` stream (whitespace aside); the text of any others comes
    whole at the end (:meth:`rest`)."""

    __slots__ = ("_arguments", "_matched", "_pending", "_state", "sent")

    def __init__(self) -> None:
        self._arguments: list[str] = []
        self._matched = 0  # characters of _OPENING seen
        self._pending = ""  # the string's content not decoded yet
        self._state = 0  # 0: in the opening, 1: in the string, 2: ended or given up
        #: The text given out so far.
        self.sent = ""

    def feed(self, piece: str) -> str:
        """The text's next piece from the arguments' next ``piece`` (may be ``""``)."""
        self._arguments.append(piece)
        if self._state == 2:
            return ""
        rest = piece
        if self._state == 0:
            for i, char in enumerate(piece):
                if char.isspace():
                    continue
                if char != _OPENING[self._matched]:
                    self._state = 2
                    return ""
                self._matched += 1
                if self._matched == len(_OPENING):
                    self._state, rest = 1, piece[i + 1:]
                    break
            else:
                return ""
        self._pending += rest
        upto, ended = _decodable(self._pending)
        if ended:
            self._state = 2
        if not upto:
            return ""
        try:
            text = json.loads(f'"{self._pending[:upto]}"', strict=False)
        except ValueError:
            self._state = 2  # not JSON after all: the end says what it was
            return ""
        self._pending = self._pending[upto:]
        text = _clean(text)
        self.sent += text
        return str(text)

    @property
    def arguments(self) -> str:
        """The arguments fed so far."""
        return "".join(self._arguments)

    def rest(self) -> tuple[str, str]:
        """At the end: (the whole text, its piece not given out yet: ``""`` when the text
        does not continue what was given out)."""
        whole = custom_input(self.arguments)
        return whole, whole[len(self.sent):] if whole.startswith(self.sent) else ""
