"""Where a chat request's compressible context is, in the OpenAI (Chat Completions and
Responses) and Anthropic formats.

Only the current turn is compressed: the messages after the last assistant message (the
user's newest message and the tool results it answers with). Everything before it (the
system prompt, tools, earlier turns) is the prefix a provider's prompt cache reads at a
tenth of the price, and the ``prompt_cache`` stage keeps it byte-stable: compressing it
anew on every turn would throw that read away. Within the current turn:

- never content at or before the last ``cache_control`` marker (the client asked for that
  prefix to be cached);
- the system prompt only when the policy asks (``compression.system``: a single-turn
  retrieval request may carry its documents there) and no marker covers it;
- tool results (OpenAI ``role: "tool"`` messages, Anthropic ``tool_result`` blocks): each
  text a segment;
- the newest user message: the question or instruction it asks is never touched. Its last
  text holds the request: that text's first and last units
  (:func:`gateway.compression.units.split`) are the instruction and the question when they
  are short prose, pinned in place, and the units between are context (a retrieval prompt:
  instruction, documents, question); its other texts are context.

:func:`plan` returns the segments (where each text lives in the body, so the compressed
text can be written back) and the question to rank them against; :func:`rewritten` makes
the compressed request from them without touching the client's: it copies only the
containers on the way to each rewritten text (a message, its content list, a block) and
shares the rest. Pure.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from gateway.compression.units import split, units_of

__all__ = ["MAX_REQUEST_CHARS", "Plan", "Segment", "plan", "rewritten"]

#: A first or last unit longer than this (characters) is context, not the request.
MAX_REQUEST_CHARS = 2_000

#: Units whose kind says they are data, never the request.
_DATA = frozenset({"document", "record", "json", "code", "bracket"})
#: Text parts: chat's and Anthropic's ``text``, Responses' ``input_text``.
_TEXT = ("text", "input_text")  # a tuple: a fuzzed "type" may be unhashable (a dict)
#: Responses items that stand for a chat message of this role.
_ITEM_ROLES = {"function_call": "assistant", "function_call_output": "tool"}


#: Keys from a request body's root down to a container in it, e.g. ``("messages", 3,
#: "content", 0)``.
Path = tuple[str | int, ...]


@dataclass(slots=True)
class Segment:
    """One text to compress: ``owner[key]`` holds it, ``owner`` being found at ``path`` in
    the body; ``pinned``: [start, end) character spans kept in place (the instruction and
    the question)."""

    owner: Any
    key: Any
    text: str
    pinned: list[tuple[int, int]] = field(default_factory=list)
    path: Path = ()

    def write(self, text: str) -> None:
        """Write ``text`` in place, into the body planned (see :func:`rewritten` for a copy)."""
        self.owner[self.key] = text


def rewritten(body: dict[str, Any], texts: list[tuple[Segment, str]]) -> dict[str, Any]:
    """A copy of ``body`` with each segment's text replaced: the containers on the way to a
    rewritten text are copied (shallow, once each), everything else is shared with ``body``,
    which is left as it was."""
    out = dict(body)
    copies: dict[Path, Any] = {(): out}
    for segment, text in texts:
        node: Any = out
        path = segment.path
        for depth in range(len(path)):
            at = path[:depth + 1]
            child = copies.get(at)
            if child is None:
                child = node[path[depth]]
                child = copies[at] = dict(child) if isinstance(child, dict) else list(child)
                node[path[depth]] = child
            node = child
        node[segment.key] = text
    return out


@dataclass(slots=True)
class Plan:
    """The segments to compress and the question they are ranked against ("" when none
    was found: then nothing is compressed)."""

    segments: list[Segment]
    question: str


def plan(api: str, body: dict[str, Any], system: bool = False) -> Plan:
    """The compressible segments of ``body`` (an OpenAI Chat Completions, Anthropic Messages
    or OpenAI Responses request, ``api`` "openai" | "anthropic" | "responses": Responses'
    ``input`` items read as messages, a ``function_call`` as an assistant turn, a
    ``function_call_output`` as a tool result, a string ``input`` as the user's message).
    ``system``: the system prompt's texts are context too (unless a ``cache_control``
    marker covers them). Malformed parts are left alone."""
    root = "input" if api == "responses" else "messages"
    messages = body.get(root)
    if isinstance(messages, str) and api == "responses":
        pins, asked = _request_spans(messages)
        found = Plan([Segment(body, "input", messages, pins)] if pins is not None else [],
                     asked)
        messages = []
    elif not isinstance(messages, list) or not messages:
        return Plan([], "")
    else:
        found = _turn(messages, root)
    if not found.question.strip():
        found.segments = []
    elif system and not any(part[2] for message in messages for part in _parts(message)):
        found.segments[:0] = _system(api, body)
    return found


def _system(api: str, body: dict[str, Any]) -> list[Segment]:
    """The system prompt's texts after its last ``cache_control`` marker."""
    texts: list[tuple[Any, str, bool, Path]] = []
    if api == "responses":
        if isinstance(body.get("instructions"), str):
            texts.append((body, "instructions", False, ()))
        items = body.get("input")
        for i, item in enumerate(items if isinstance(items, list) else ()):
            if _role(item) not in ("system", "developer"):
                break
            if isinstance(item.get("content"), str):
                texts.append((item, "content", False, ("input", i)))
            else:
                texts += _text_blocks(item.get("content"), ("input", i, "content"))
    elif api == "anthropic":
        if isinstance(body.get("system"), str):
            texts.append((body, "system", False, ()))
        else:
            texts += _text_blocks(body.get("system"), ("system",))
    else:
        for i, message in enumerate(body["messages"]):
            if _role(message) not in ("system", "developer"):
                break
            if isinstance(message.get("content"), str):
                texts.append((message, "content", "cache_control" in message, ("messages", i)))
            else:
                texts += _text_blocks(message.get("content"), ("messages", i, "content"))
    marked = [n for n, (_, _, mark, _) in enumerate(texts) if mark]
    free = texts[marked[-1] + 1:] if marked else texts
    return [Segment(owner, key, owner[key], path=path) for owner, key, _, path in free]


def _text_blocks(blocks: Any, path: Path) -> list[tuple[Any, str, bool, Path]]:
    if not isinstance(blocks, list):
        return []
    return [(b, "text", "cache_control" in b, (*path, j)) for j, b in enumerate(blocks)
            if isinstance(b, dict) and b.get("type") in _TEXT and isinstance(b.get("text"), str)]


def _turn(messages: list[Any], root: str) -> Plan:
    start = 0
    for i, message in enumerate(messages):
        if _role(message) == "assistant":
            start = i + 1
    turn = messages[start:]
    # Everything up to the last cache_control marker stays as the client sent it.
    blocks = [(i, part) for i, message in enumerate(turn)
              for part in _parts(message, (root, start + i))]
    marked = [n for n, (_, part) in enumerate(blocks) if part[2]]
    first_free = marked[-1] + 1 if marked else 0
    last_user = max((i for i, m in enumerate(turn) if _role(m) == "user"), default=-1)
    user_texts = [n for n, (i, part) in enumerate(blocks)
                  if i == last_user and part[3] == "text"]
    question = ""
    if not user_texts:  # the request is in an earlier turn: its last user text asks it
        question = _question_text(_last_user_text(messages[:start]))
    segments: list[Segment] = []
    for n, (i, (owner, key, _, kind, path)) in enumerate(blocks):
        if kind == "marker":
            continue
        text = owner[key]
        if i == last_user and kind == "text" and n == user_texts[-1]:
            # The newest user message's last text: the request, with context around it.
            pins, asked = _request_spans(text)
            question = asked
            if n >= first_free and pins is not None:
                segments.append(Segment(owner, key, text, pins, path))
            continue
        if n >= first_free:
            segments.append(Segment(owner, key, text, path=path))
    return Plan(segments if question.strip() else [], question)


def _role(message: Any) -> str | None:
    """A message's role; a Responses item's as the chat message it stands for."""
    if not isinstance(message, dict):
        return None
    role = _ITEM_ROLES.get(str(message.get("type")))
    return role if role is not None else message.get("role")


def _parts(message: Any, path: Path = ()) -> Iterator[tuple[Any, Any, bool, str, Path]]:
    """(owner, key, has cache_control, kind, the owner's path) of each text in a message
    (found at ``path``); kind is "text" for the user's own text, "tool" for a tool
    result's, "marker" for a ``cache_control`` marker on what is never compressed (a
    system message in the turn, Anthropic's mid-conversation ones among them: its marker
    still ends a prefix the client asked to cache)."""
    role = _role(message)
    if role not in ("user", "tool"):
        yield from _markers(message, path)
        return
    kind = "tool" if role == "tool" else "text"
    field = "output" if message.get("type") == "function_call_output" else "content"
    content = message.get(field)
    if isinstance(content, str):
        yield message, field, "cache_control" in message, kind, path
        return
    if not isinstance(content, list):
        return
    for j, block in enumerate(content):
        if not isinstance(block, dict):
            continue
        marked = "cache_control" in block
        at = (*path, "content", j)
        if block.get("type") in _TEXT and isinstance(block.get("text"), str):
            yield block, "text", marked, kind, at
        elif block.get("type") == "tool_result":
            inner = block.get("content")
            if isinstance(inner, str):
                yield block, "content", marked, "tool", at
            elif isinstance(inner, list):
                texts = [(k, b) for k, b in enumerate(inner) if isinstance(b, dict)
                         and b.get("type") == "text" and isinstance(b.get("text"), str)]
                for n, (k, b) in enumerate(texts):
                    # A marker on the result covers all of it.
                    last = n == len(texts) - 1
                    yield (b, "text", "cache_control" in b or (marked and last), "tool",
                           (*at, "content", k))
                if not texts and marked:  # a marker with nothing to compress
                    yield block, "type", True, "marker", at
        elif marked:
            yield block, "type", True, "marker", at


def _markers(message: Any, path: Path) -> Iterator[tuple[Any, Any, bool, str, Path]]:
    """The ``cache_control`` markers of a message whose texts are not compressed."""
    if not isinstance(message, dict):
        return
    if "cache_control" in message:
        yield message, "role", True, "marker", path
    content = message.get("content")
    for j, block in enumerate(content if isinstance(content, list) else ()):
        if isinstance(block, dict) and "cache_control" in block:
            yield block, "type", True, "marker", (*path, "content", j)


def _last_user_text(messages: list[Any]) -> str:
    for message in reversed(messages):
        if _role(message) != "user":
            continue
        texts = [owner[key] for owner, key, _, kind, _ in _parts(message) if kind == "text"]
        if texts:
            return str(texts[-1])
    return ""


def _question_text(text: str) -> str:
    return _request_spans(text)[1] if text else ""


def _request_spans(text: str) -> tuple[list[tuple[int, int]] | None, str]:
    """The pinned spans of the newest user text (its instruction and question units) and
    the question; pins None when nothing is left to compress between them."""
    units = units_of(split(text))
    if len(units) < 2:
        return None, text
    first, last = units[0], units[-1]
    request = [u for u in (first, last)
               if u.kind not in _DATA and len(u.text) <= MAX_REQUEST_CHARS]
    if not request:
        return None, ""
    question = last.text if request[-1] is last else first.text
    pins = [(u.start, u.end) for u in request]
    if len(units) - len(request) < 2:
        return None, question
    return pins, question
