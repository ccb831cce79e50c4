"""The user's text of a chat request, read by the two rules the gateway needs. Pure.

Both read a request as OpenAI chat (``messages``; an Anthropic request through its
``chat_view``), and they differ on purpose:

- :func:`final_user_text`, the response cache's rule: the text compared by meaning is the
  final message's, and only when it is a user turn of text alone. A conversation ending in
  a tool result, or a message carrying an image, can only hit exactly: an answer to other
  inputs must never be served for it.
- :func:`last_user_text`, the router's rule: the text that says how hard the request is,
  the last user message's text parts (an image beside them skipped), wherever it stands.
  The router's training reads prompts the same way.

:func:`leading_messages` and :func:`opening_message` read what a conversation's turns share
(its leading system messages, its opening message): what names a conversation for OpenAI's
``prompt_cache_key`` and for the router's tier.

(The compress stage's question is a third reading, of the turn it compresses:
:mod:`gateway.compression.messages`.) Each is computed once per request and kept on the
request's context (``RequestContext.semantic_query``, ``RequestContext.last_user_text``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["final_user_text", "last_user_text", "leading_messages", "opening_message"]


def final_user_text(messages: Any) -> str | None:
    """The final message's text when it is a user turn of text alone (text parts joined by
    newlines); else None (an empty conversation, another role, an image or any other
    non-text part)."""
    if not isinstance(messages, list) or not messages:
        return None
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "user":
        return None
    content = last.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                return None  # images, audio, files: never compared by meaning
            parts.append(str(part.get("text", "")))
        return "\n".join(parts)
    return None


def last_user_text(messages: Any) -> str:
    """The text of the last user message (its text parts joined by newlines), or ""."""
    if not isinstance(messages, list):
        return ""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return "\n".join(str(p.get("text", "")) for p in content
                                 if isinstance(p, dict) and p.get("type") == "text")
            return ""
    return ""


def opening_message(messages: Any) -> Any:
    """The first message (or Responses item) after the leading system and developer ones:
    what opens the conversation; None when there is none."""
    if isinstance(messages, str):
        return messages
    for message in messages if isinstance(messages, list) else ():
        if not isinstance(message, dict) or message.get("role") not in ("system", "developer"):
            return message
    return None


def leading_messages(messages: Any) -> list[Any]:
    """The leading system and developer messages (or Responses items) of a list."""
    static: list[Any] = []
    for message in messages or ():
        if not isinstance(message, dict) or message.get("role") not in ("system", "developer"):
            break
        static.append(message)
    return static
