"""Moving volatile text to the very end of a request, in either API's shape.

A changing line anywhere in the system prompt or a tool description sits before the whole
conversation, so it breaks the cache of everything after it. Taken out
(:mod:`gateway.prompt_cache.volatile`), it is put back where a later request of the same
conversation shares nothing anyway: after the last turn.

- **Anthropic**: a text block at the end of the last user turn (after its tool results,
  which must come first), so after the rolling cache breakpoint, which sits on the block
  before it.
- **OpenAI-compatible** (and the local engine): a final ``user`` message. A user message is
  what every OpenAI-compatible server and chat template accepts at the end (a late
  ``system`` message is refused by some templates; the local engine's ChatML one renders
  consecutive user turns as they are).

Each moved piece says where it came from::

    Note from the system prompt: The current time is 2024-05-15 15:00:00 EST.
    Note from the description of the tool get_time: [note 1] is 2024-05-15

The text it left keeps nothing in place of a whole line or sentence, and a placeholder
``[note N]`` in place of a span cut out of a long sentence. A system prompt emptied
completely goes away (an OpenAI system message, an Anthropic ``system``), as does an emptied
text block, unless the client put a cache marker on it (then it reads "(moved to the end)").
What is changed is copied; the input body is left as it was. Pure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.prompt_cache.canonical import tool_name
from gateway.prompt_cache.volatile import Moved

__all__ = ["Note", "Relocate", "anthropic_append", "anthropic_relocate", "note_text",
           "openai_append", "openai_relocate", "source_label"]

#: (source key, text) -> (the text left, what was moved out of it). Source keys:
#: ``system`` and ``tool:NAME``.
Relocate = Callable[[str, str], tuple[str, list[Moved]]]
#: A moved piece and its source key.
Note = tuple[str, Moved]

_EMPTIED = "(moved to the end)"


def source_label(source: str) -> str:
    if source.startswith("tool:"):
        return f"the description of the tool {source[5:]}"
    return "the system prompt"


def note_text(notes: list[Note]) -> str:
    """The text put at the end: one line per moved piece, saying where it came from."""
    lines = []
    for source, moved in notes:
        head = f"Note from {source_label(source)}: "
        if moved.label is not None:
            head += f"[note {moved.label}] is "
        lines.append(head + moved.text)
    return "\n".join(lines)


# -- OpenAI Chat Completions ---------------------------------------------------------------

def openai_relocate(body: dict[str, Any], relocate: Relocate
                    ) -> tuple[dict[str, Any], list[Note]]:
    """Volatile text out of the leading system (and developer) messages and the function
    tools' descriptions."""
    notes: list[Note] = []
    out = dict(body)
    messages = body.get("messages")
    if isinstance(messages, list):
        kept: list[Any] = []
        leading = True
        for message in messages:
            leading = leading and isinstance(message, dict) \
                and message.get("role") in ("system", "developer")
            if not leading:
                kept.append(message)
                continue
            content = _content(message.get("content"), relocate, notes)
            if content is None:
                kept.append(message)
            elif content:
                kept.append({**message, "content": content})
        if notes:
            out["messages"] = kept
    tools = body.get("tools")
    if isinstance(tools, list):
        out["tools"] = [_openai_tool(t, relocate, notes) for t in tools]
    return out, notes


def _content(content: Any, relocate: Relocate, notes: list[Note]) -> Any:
    """A system message's content without its volatile text; None when unchanged, "" or []
    when nothing is left."""
    if isinstance(content, str):
        text, moved = relocate("system", content)
        if not moved:
            return None
        notes.extend(("system", m) for m in moved)
        return text if text.strip() else ""
    if isinstance(content, list):
        parts, changed = [], False
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" \
                    and isinstance(part.get("text"), str):
                text, moved = relocate("system", part["text"])
                if moved:
                    changed = True
                    notes.extend(("system", m) for m in moved)
                    if text.strip():
                        parts.append({**part, "text": text})
                    continue
            parts.append(part)
        return parts if changed else None
    return None


def _openai_tool(tool: Any, relocate: Relocate, notes: list[Note]) -> Any:
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(function, dict):
        return tool
    described = _described(f"tool:{tool_name(tool)}", function, relocate, notes)
    return tool if described is None else {**tool, "function": described}


def _described(source: str, holder: dict[str, Any], relocate: Relocate,
               notes: list[Note]) -> dict[str, Any] | None:
    """``holder`` (a tool, or its ``function``) with the volatile spans of its
    ``description`` moved out into ``notes``; None when nothing moved."""
    if not isinstance(holder.get("description"), str):
        return None
    text, moved = relocate(source, holder["description"])
    if not moved:
        return None
    notes.extend((source, m) for m in moved)
    return {**holder, "description": text}


def openai_append(body: dict[str, Any], notes: list[Note]) -> dict[str, Any]:
    """``body`` with the notes as a final user message."""
    if not notes:
        return body
    messages = body.get("messages")
    messages = list(messages) if isinstance(messages, list) else []
    return {**body, "messages": [*messages, {"role": "user", "content": note_text(notes)}]}


# -- Anthropic Messages ---------------------------------------------------------------------

def anthropic_relocate(body: dict[str, Any], relocate: Relocate
                       ) -> tuple[dict[str, Any], list[Note]]:
    """Volatile text out of ``system`` (a string or text blocks) and the tools'
    descriptions."""
    notes: list[Note] = []
    out = dict(body)
    system = body.get("system")
    if isinstance(system, str):
        text, moved = relocate("system", system)
        if moved:
            notes.extend(("system", m) for m in moved)
            if text.strip():
                out["system"] = text
            else:
                del out["system"]
    elif isinstance(system, list):
        blocks = []
        for block in system:
            if isinstance(block, dict) and block.get("type") == "text" \
                    and isinstance(block.get("text"), str):
                text, moved = relocate("system", block["text"])
                if moved:
                    notes.extend(("system", m) for m in moved)
                    if text.strip() or block.get("cache_control") is not None:
                        blocks.append({**block, "text": text if text.strip() else _EMPTIED})
                    continue
            blocks.append(block)
        if notes:
            if blocks:
                out["system"] = blocks
            else:
                del out["system"]
    tools = body.get("tools")
    if isinstance(tools, list):
        out["tools"] = [_anthropic_tool(t, relocate, notes) for t in tools]
    return out, notes


def _anthropic_tool(tool: Any, relocate: Relocate, notes: list[Note]) -> Any:
    if not isinstance(tool, dict):
        return tool
    return _described(f"tool:{tool_name(tool)}", tool, relocate, notes) or tool


def anthropic_append(body: dict[str, Any], notes: list[Note]) -> dict[str, Any]:
    """``body`` with the notes as a text block ending its last user message."""
    if not notes:
        return body
    messages = list(body["messages"])
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            blocks = list(content) if isinstance(content, list) else \
                [{"type": "text", "text": content}]
            blocks.append({"type": "text", "text": note_text(notes)})
            messages[i] = {**message, "content": blocks}
            return {**body, "messages": messages}
    return body  # no user turn (Anthropic requires one): nothing to append to
