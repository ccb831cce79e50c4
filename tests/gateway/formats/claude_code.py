"""What Claude Code (2.1.197, @anthropic-ai/claude-code on npm) reads in an error: the checks
its bundled cli.js makes before it recovers, written again in Python, so that a test can
ask whether an answer of the gateway would set the recovery off.

Its Anthropic SDK's ``APIError.message`` is ``"<status> <the body as JSON>"`` (the body
has no top-level ``message``), so each check reads the whole body, JSON-escaped.
"""

from __future__ import annotations

import re

import orjson

__all__ = ["MID_CONVERSATION_BETA", "folds_system_messages", "lowers_max_tokens",
           "prompt_too_long", "sdk_message"]

#: The beta Claude Code sends with system-role messages inside ``messages``.
MID_CONVERSATION_BETA = "mid-conversation-system-2026-04-07"


def sdk_message(status: int, body: bytes) -> str:
    """The SDK's error message for an error answer: its status, then its body as JSON."""
    return f"{status} {orjson.dumps(orjson.loads(body)).decode()}"


def folds_system_messages(status: int, body: bytes) -> bool:
    """Whether Claude Code retries without its mid-conversation system messages (folded into
    ``<system-reminder>`` text of its user turns): a 400 naming the beta and
    ``anthropic-beta``, or Anthropic's "Unexpected role ... input message role", or
    "not supported" with "role 'system'" (cli.js, function ``MBn``)."""
    if status != 400:
        return False
    text = sdk_message(status, body)
    if MID_CONVERSATION_BETA in text and "anthropic-beta" in text:
        return True
    if "Unexpected role" in text and "input message role" in text:
        return True
    return "not supported" in text and re.search(r"role .{0,2}system", text,
                                                 re.IGNORECASE) is not None


def prompt_too_long(status: int, body: bytes) -> tuple[int, int] | None:
    """(tokens, limit) when Claude Code reads the error as a prompt too long for the model
    (it then compacts the conversation): "prompt is too long" in the message, its numbers
    read by ``/prompt is too long[^0-9]*(\\d+)\\s*tokens?\\s*>\\s*(\\d+)/i`` (``t3t``)."""
    text = sdk_message(status, body)
    if "prompt is too long" not in text.lower():
        return None
    found = re.search(r"prompt is too long[^0-9]*(\d+)\s*tokens?\s*>\s*(\d+)", text,
                      re.IGNORECASE)
    return (int(found[1]), int(found[2])) if found else None


def lowers_max_tokens(status: int, body: bytes) -> tuple[int, int, int] | None:
    """(input tokens, max_tokens, context limit) when Claude Code retries with a smaller
    ``max_tokens``: a 400 matching "input length and `max_tokens` exceed context limit:
    N + M > L" (``nmc``)."""
    found = re.search(r"input length and `max_tokens` exceed context limit: (\d+) \+ (\d+) > "
                      r"(\d+)", sdk_message(status, body))
    if status != 400 or found is None:
        return None
    return int(found[1]), int(found[2]), int(found[3])
