"""P4, volatile lines moved to the end: what the contract allows, and undoing it.

At most :data:`MAX_LINES` whole lines of the system prompt, together at most
:data:`MAX_SHARE` of its tokens (o200k_base), each removed from its text with its "\\n" (no text
emptied, the rest byte-identical) and appended verbatim, in their original order, after one
marker line: ``MARKER + "\\n" + "\\n".join(lines)``. Each moved line is short
(:data:`~tests.gateway.equivalence.lines.MAX_LINE`), inside no structure
(:func:`~tests.gateway.equivalence.lines.enclosed`), and either a metadata line by the
test's own reading (:func:`~tests.gateway.equivalence.lines.is_metadata`) or one the
traffic showed to change (:mod:`~tests.gateway.equivalence.evidence`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gateway.compression.tokens import o200k
from gateway.prompt_cache.relocate import MARKER
from tests.gateway.equivalence.diff import shorten, text_difference
from tests.gateway.equivalence.lines import MAX_LINE, enclosed, is_metadata

__all__ = ["MARKER", "MAX_LINES", "MAX_SHARE", "Moves", "block", "removed_lines"]

MAX_LINES = 3
MAX_SHARE = 0.05


def block(lines: list[str]) -> str:
    """The text appended at the end for ``lines`` moved."""
    return MARKER + "\n" + "\n".join(lines)


def removed_lines(original: str, shaped: str) -> list[int] | None:
    """Indices (into ``original.split("\\n")``) of the whole lines ``shaped`` lacks, or
    None when ``shaped`` is not ``original`` with some lines taken out."""
    lines, kept = original.split("\n"), shaped.split("\n")
    gone: list[int] = []
    j = 0
    for i, line in enumerate(lines):
        if j < len(kept) and kept[j] == line:
            j += 1
        else:
            gone.append(i)
    return gone if j == len(kept) else None


@dataclass
class Moves:
    """The system prompt's texts, client and upstream side, compared pair by pair: what left
    them (``lines``, in order) and the first violation (``error``)."""

    changing: frozenset[str]
    texts: list[str] = field(default_factory=list)  # the client's system prompt
    error: str | None = None

    def __post_init__(self) -> None:
        self.lines: list[str] = []

    def compare(self, path: str, client: str, upstream: str, restore: Callable[[], None]
                ) -> None:
        """One text of the system prompt; ``restore`` puts the client's text back upstream
        once what left it is accounted for."""
        self.texts.append(client)
        if self.error is not None or client == upstream:
            return
        gone = removed_lines(client, upstream)
        if gone is None:
            self.error = (f"{path}: the system prompt changed beyond whole lines moved out: "
                          f"{text_difference(client, upstream)}")
            return
        if client.strip() and not upstream.strip():
            self.error = f"{path}: the system prompt text was emptied"
            return
        lines = client.split("\n")
        structured = enclosed(client)
        for i in gone:
            line = lines[i]
            why = _refused(line, i in structured, self.changing)
            if why is not None:
                self.error = f"{path}: line {i + 1} {shorten(line)} was moved, but {why}"
                return
            self.lines.append(line)
        restore()

    def finish(self) -> None:
        """The bounds on all the moved lines together (call once every text is compared)."""
        if self.error is not None or not self.lines:
            return
        if len(self.lines) > MAX_LINES:
            self.error = (f"{len(self.lines)} lines moved out of the system prompt (at most "
                          f"{MAX_LINES}): {shorten(self.lines)}")
        else:
            moved, total = sum(map(tokens, self.lines)), sum(map(tokens, self.texts))
            if moved > MAX_SHARE * total:
                self.error = (f"the lines moved out of the system prompt hold {moved} of its "
                              f"{total} tokens (o200k_base; at most {MAX_SHARE:.0%}): "
                              f"{shorten(self.lines)}")

    def nothing_may_move(self, why: str) -> None:
        if self.error is None and self.lines:
            self.error = f"lines moved out of the system prompt although {why}: " \
                         f"{shorten(self.lines)}"


@functools.lru_cache(maxsize=64)
def tokens(text: str) -> int:
    """``text``'s o200k_base tokens (the same system prompt comes back request after
    request: counted once)."""
    return o200k()(text)


def _refused(line: str, structured: bool, changing: Iterable[str]) -> str | None:
    if not line.strip():
        return "it is blank"
    if len(line.strip()) > MAX_LINE:
        return f"it is longer than {MAX_LINE} characters"
    if structured:
        return ("it is inside a structure (code, list, table, JSON, tagged section, "
                "indented text or a document)")
    if not is_metadata(line) and line not in changing:
        return "it is not a metadata line (date, time or id) nor shown to change"
    return None
