"""A continuation-capable OpenAI-compatible target, for :mod:`.fake_upstream`: a chat
request with ``continue_final_message: true`` whose last message is an assistant's text
that the answer begins with is answered with the rest of the answer only, as vLLM and
SGLang continue a final assistant message
(https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html#chat-api). Without
the flag the answer starts anew, as a server that ignores it would."""

from __future__ import annotations

from typing import Any

__all__ = ["continued"]


def continued(pieces: list[str], data: dict[str, Any]) -> list[str]:
    """``pieces`` after the text of a final assistant message to continue (module doc)."""
    messages = data.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else None
    if not (data.get("continue_final_message") and isinstance(last, dict)
            and last.get("role") == "assistant" and isinstance(last.get("content"), str)):
        return pieces
    prefix = last["content"]
    if not "".join(pieces).startswith(prefix):
        return pieces
    out, at = [], 0
    for piece in pieces:
        if at + len(piece) > len(prefix):
            out.append(piece[max(len(prefix) - at, 0):])
        at += len(piece)
    return out
