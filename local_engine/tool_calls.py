"""The engine's tool-call format: tools in the prompt, calls in the output, results fed back.

SmolLM2's chat template has no tool syntax, so the engine uses the Hermes function-calling
format (NousResearch's Hermes 2 Pro; Qwen2.5's template uses it too), written out here:

- the tools go at the end of the system prompt (one is added when there is none)::

      # Tools
      You may call one or more functions. Their signatures, one a line, in <tools></tools>:
      <tools>
      {"name": ..., "description": ..., "parameters": {...}}
      </tools>
      To call a function, answer with <tool_call>{"name": <function name>, "arguments":
      <a JSON object>}</tool_call>, one per call, on lines of their own.

- a call in the output is exactly ``<tool_call>{"name": "NAME", "arguments": ARGS}</tool_call>``
  (calls separated by a newline), the grammar guaranteeing it (:mod:`local_engine.structured`);
- an assistant turn with ``tool_calls`` is rendered back in that form after its text, and a
  ``tool`` message as a turn of role ``tool`` holding the result, so the next turn sees the
  whole exchange.

:class:`CallParser` turns the output text, whole or piece by piece, into OpenAI chat deltas:
``content``, or ``tool_calls`` entries (``index``, ``id``, ``type``, ``function.name`` on the
first, then ``function.arguments`` pieces). An output starts a call or is text from its
first character (the grammar forbids text starting with ``<``).
Sources: https://platform.openai.com/docs/guides/function-calling,
https://github.com/NousResearch/Hermes-Function-Calling
"""

from __future__ import annotations

import json
import uuid
from typing import Any

__all__ = ["CALL_PREFIX", "CALL_SUFFIX", "CallParser", "merge", "render_call", "tools_prompt"]

CALL_PREFIX = '<tool_call>{"name": "'
NAME_END = '", "arguments": '
CALL_SUFFIX = "}</tool_call>"
CALL_SEPARATOR = "\n"


def tools_prompt(functions: list[dict[str, Any]]) -> str:
    """The system prompt section describing ``functions`` (OpenAI ``function`` objects:
    name, description, parameters)."""
    lines = [json.dumps(fn, separators=(", ", ": ")) for fn in functions]
    return ("# Tools\nYou may call one or more functions. Their signatures, one a line, in "
            "<tools></tools>:\n<tools>\n" + "\n".join(lines) + "\n</tools>\nTo call a function, "
            'answer with <tool_call>{"name": <function name>, "arguments": <a JSON object>}'
            "</tool_call>, one per call, on lines of their own.")


def render_call(name: str, arguments: str) -> str:
    """A call as the model writes it (``arguments``: a JSON text; compacted when valid)."""
    try:
        arguments = json.dumps(json.loads(arguments), separators=(", ", ": "))
    except ValueError:
        pass
    return f"{CALL_PREFIX}{name}{NAME_END}{arguments}{CALL_SUFFIX}"


class CallParser:
    """Output text -> OpenAI chat deltas. ``feed(text)`` returns the deltas that text
    completes; ``close()`` the rest (a call cut short by ``max_tokens`` gives the arguments
    written so far). ``calls`` counts the calls started."""

    def __init__(self) -> None:
        self._buf = ""
        self._mode: str | None = None  # "text" | "calls"
        self._in_args = False
        self._sent = 0  # characters of the current call's arguments already sent
        self.calls = 0

    def feed(self, text: str) -> list[dict[str, Any]]:
        if not text:
            return []
        if self._mode is None:
            self._mode = "calls" if text.startswith("<") else "text"
        if self._mode == "text":
            return [{"content": text}]
        self._buf += text
        out: list[dict[str, Any]] = []
        while True:
            if not self._in_args:
                start = self._buf.find(CALL_PREFIX)
                end = self._buf.find(NAME_END, start + len(CALL_PREFIX)) if start >= 0 else -1
                if end < 0:
                    return out
                name = self._buf[start + len(CALL_PREFIX):end]
                self._buf = self._buf[end + len(NAME_END):]
                out.append({"tool_calls": [{
                    "index": self.calls, "id": "call_" + uuid.uuid4().hex[:24],
                    "type": "function", "function": {"name": name, "arguments": ""}}]})
                self.calls += 1
                self._in_args, self._sent = True, 0
            end = self._args_end()
            if end < 0:  # hold back what may be the start of the suffix
                upto = max(self._sent, len(self._buf) - len(CALL_SUFFIX) + 1)
                out.extend(self._args(upto))
                return out
            out.extend(self._args(end))
            self._buf = self._buf[end + len(CALL_SUFFIX):]
            self._in_args = False

    def close(self) -> list[dict[str, Any]]:
        if self._mode == "calls" and self._in_args:
            return self._args(len(self._buf))
        return []

    def _args_end(self) -> int:
        """Where the current call's arguments end (the suffix follows), or -1."""
        at = self._buf.find(CALL_SUFFIX)
        while at >= 0:
            try:
                json.loads(self._buf[:at])
                return at
            except ValueError:  # the suffix's text inside a string of the arguments
                at = self._buf.find(CALL_SUFFIX, at + 1)
        return -1

    def _args(self, upto: int) -> list[dict[str, Any]]:
        if upto <= self._sent:
            return []
        piece = self._buf[self._sent:upto]
        self._sent = upto
        return [{"tool_calls": [{"index": self.calls - 1,
                                 "function": {"arguments": piece}}]}]


def merge(deltas: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """The whole message of a list of deltas: (content, tool_calls)."""
    content = ""
    calls: list[dict[str, Any]] = []
    for delta in deltas:
        content += delta.get("content", "")
        for piece in delta.get("tool_calls", ()):
            if "id" in piece:
                calls.append({"id": piece["id"], "type": "function",
                              "function": dict(piece["function"])})
            else:
                calls[piece["index"]]["function"]["arguments"] += piece["function"]["arguments"]
    return content, calls
