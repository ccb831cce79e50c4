"""Moving volatile lines from the system prompt to the very end of a request, in either
API's shape.

A changing line anywhere in the system prompt sits before the whole conversation, so it
breaks the cache of everything after it. Taken out (:func:`gateway.prompt_cache.volatile.plan`
says which lines, and what is left of each text), it is put back where a later request of
the same conversation shares nothing anyway: after the last turn, verbatim, under one
marker line (:data:`MARKER`) saying where it came from::

    [From the system prompt, moved here for prompt caching]
    The current time is 2024-05-15 15:00:00 EST.

The block goes into the request's last message, which must be the user's (or, OpenAI, a
tool result: then it is a user message of its own after it):

- **OpenAI-compatible** (and the local engine): a string content gets ``"\\n\\n"`` and the
  block; a list of parts gets one more text part; after a final ``tool`` message, a final
  ``user`` message holds the block (a user message after tool results is what every
  OpenAI-compatible server and chat template accepts; two user messages in a row are not).
- **Anthropic**: one more text block in the last user turn (after its tool results, which
  must come first), so after the rolling cache breakpoint, which sits on the block before.

A request ending any other way (an assistant message to continue: a prefill) moves nothing:
there is no end to put the lines at without changing what is asked. A system text block the
client marked with ``cache_control`` is left as it is (the client chose that prefix). What
is changed is copied; the input body is left as it was. Pure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.prompt_cache.volatile import Cut, Moved

__all__ = ["MARKER", "Planner", "anthropic", "anthropic_append", "block_text", "openai",
           "system_texts"]

#: The line before the moved lines.
MARKER = "[From the system prompt, moved here for prompt caching]"

#: The system prompt's texts -> the cut of each text that loses lines (empty: none).
Planner = Callable[[list[str]], dict[str, Cut]]


def block_text(moved: list[Moved]) -> str:
    """What is put at the end: the marker, then the lines, verbatim."""
    return "\n".join([MARKER, *(m.text for m in moved)])


def system_texts(body: dict[str, Any], api: str) -> list[str]:
    """The system prompt's texts, in order: Anthropic's ``system`` (a string, or its text
    blocks not marked by the client); OpenAI's leading system and developer messages."""
    if api == "anthropic":
        return _texts(body.get("system"), marked=False)
    texts: list[str] = []
    for message in _leading(body):
        texts.extend(_texts(message.get("content"), marked=True))
    return texts


def _leading(body: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for message in body.get("messages") or ():
        if not isinstance(message, dict) or message.get("role") not in ("system", "developer"):
            break
        out.append(message)
    return out


def _texts(content: Any, marked: bool) -> list[str]:
    """The texts of a string or a list of text blocks (parts); ``marked``: blocks carrying
    ``cache_control`` count too."""
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return []
    return [b["text"] for b in content if isinstance(b, dict) and b.get("type") == "text"
            and isinstance(b.get("text"), str) and (marked or "cache_control" not in b)]


def _cut_content(content: Any, cuts: dict[str, Cut], moved: list[Moved], marked: bool) -> Any:
    """A system content (a string or text blocks) with its cut texts replaced; the very
    object given when nothing in it is cut."""
    if isinstance(content, str):
        cut = cuts.get(content)
        if cut is None:
            return content
        moved.extend(cut[1])
        return cut[0]
    if not isinstance(content, list) or not any(
            isinstance(b, dict) and isinstance(b.get("text"), str) and b["text"] in cuts
            for b in content):
        return content  # unchanged: the same object
    out = []
    for block in content:
        cut = None
        if isinstance(block, dict) and block.get("type") == "text" \
                and isinstance(block.get("text"), str) and (marked or "cache_control" not in block):
            cut = cuts.get(block["text"])
        if cut is None:
            out.append(block)
        else:
            moved.extend(cut[1])
            out.append({**block, "text": cut[0]})
    return out


# -- OpenAI Chat Completions ---------------------------------------------------------------

def openai(body: dict[str, Any], planner: Planner) -> tuple[dict[str, Any], list[Moved]]:
    """``body`` with its volatile lines moved to its end, and the lines moved (none: the
    body as it was)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict) \
            or messages[-1].get("role") not in ("user", "tool"):
        return body, []
    cuts = planner(system_texts(body, "openai"))
    if not cuts:
        return body, []
    moved: list[Moved] = []
    out = list(messages)
    for i, message in enumerate(_leading(body)):
        content = message.get("content")
        cut = _cut_content(content, cuts, moved, True)
        if cut is not content:
            out[i] = {**message, "content": cut}
    block = block_text(moved)
    last = out[-1]
    content = last.get("content")
    if last.get("role") == "tool":
        out.append({"role": "user", "content": block})
    elif isinstance(content, str):
        out[-1] = {**last, "content": f"{content}\n\n{block}"}
    elif isinstance(content, list):
        out[-1] = {**last, "content": [*content, {"type": "text", "text": block}]}
    else:
        return body, []
    return {**body, "messages": out}, moved


# -- Anthropic Messages ---------------------------------------------------------------------

def anthropic(body: dict[str, Any], planner: Planner) -> tuple[dict[str, Any], list[Moved]]:
    """``body`` with its volatile lines taken out of ``system``, and the lines (none: the
    body as it was); :func:`anthropic_append` then puts them at the end, once the cache
    markers are placed (so after the rolling one)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict) \
            or messages[-1].get("role") != "user":
        return body, []
    content = messages[-1].get("content")
    if not content or not isinstance(content, str | list):
        return body, []
    cuts = planner(system_texts(body, "anthropic"))
    if not cuts:
        return body, []
    moved: list[Moved] = []
    return {**body, "system": _cut_content(body.get("system"), cuts, moved, False)}, moved


def anthropic_append(body: dict[str, Any], moved: list[Moved]) -> dict[str, Any]:
    """``body`` (from :func:`anthropic`) with the moved lines ending its last user turn."""
    if not moved:
        return body
    messages = body["messages"]
    last = messages[-1]
    content = last["content"]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    blocks.append({"type": "text", "text": block_text(moved)})
    return {**body, "messages": [*messages[:-1], {**last, "content": blocks}]}
