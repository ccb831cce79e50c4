"""The OpenAI wire format: requests in, answers and errors out. Pure, no I/O.

- :func:`parse_request`: a request body, parsed once and checked at the door. Only what the
  gateway relies on is checked (the upstream validates the rest, and fields it does not know
  pass through untouched, so new API fields work on day one). Errors follow the OpenAI
  shape: ``invalid_request_error`` with ``param`` naming the field.
- :func:`answer_from_completion` / :class:`AnswerCollector`: the format-neutral
  :class:`~gateway.formats.answer.Answer` of a ``chat.completion`` (parsed) or chunk stream.
- :func:`completion_body` / :func:`completion_events`: an answer rendered as a
  ``chat.completion`` JSON body or as a chunk stream (role chunk, content chunks, finish
  chunk, usage chunk when asked, ``[DONE]``) that the openai SDK parses like any other.
- :func:`error_body` / :func:`error_event`: a :class:`~gateway.errors.GatewayError` as an
  error response body or as an SSE error event (the SDK raises on it).

Wire format: https://platform.openai.com/docs/api-reference/chat
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal

import orjson

from gateway.errors import GatewayError, InvalidRequest
from gateway.formats.answer import Answer
from gateway.formats.checks import invalid_type, load_request, message_list, missing
from gateway.formats.ids import random_hex
from llm_wire.sse import DONE, data_event, json_event

__all__ = [
    "AnswerCollector", "RequestKind", "answer_from_completion", "completion_body",
    "completion_events", "error_body", "error_event", "parse_request", "with_usage_option",
]

RequestKind = Literal["chat", "completions", "embeddings"]

_END = b"\n\n" + DONE  # the end of a stream as OpenAI sends it
_END_LEN = len(_END)

_NUMBERS: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
}
_POSITIVE_INTS = frozenset({"max_tokens", "max_completion_tokens", "n"})


def parse_request(body: bytes, kind: RequestKind) -> dict[str, Any]:
    """The request as a dict; raises InvalidJSON or InvalidRequest (400) naming the field."""
    data = load_request(body)
    if kind == "chat":
        _check_messages(data.get("messages"))
    elif kind == "completions":
        if "prompt" not in data:
            raise missing("prompt")
        if not isinstance(data["prompt"], (str, list)):
            raise invalid_type("prompt", "a string or an array", data["prompt"])
    elif "input" not in data:
        raise missing("input")
    stream = data.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise invalid_type("stream", "a boolean", stream)
    if kind == "embeddings" and stream:
        raise InvalidRequest("embeddings cannot be streamed", param="stream")
    options = data.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise invalid_type("stream_options", "an object", options)
    for name, value in data.items():  # only the fields present, usually a handful
        if value is None:
            continue
        bounds = _NUMBERS.get(name)
        if bounds is not None:
            lo, hi = bounds
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not lo <= value <= hi:
                raise InvalidRequest(f"'{name}' must be a number between {lo} and {hi}, "
                                     f"got {value!r}", param=name, code="invalid_value")
        elif name in _POSITIVE_INTS:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidRequest(f"'{name}' must be an integer >= 1, got {value!r}",
                                     param=name, code="invalid_value")
        elif name == "stop" and not (isinstance(value, str) or (
                isinstance(value, list) and all(isinstance(s, str) for s in value))):
            raise invalid_type("stop", "a string or an array of strings", value)
    return data


def _check_messages(messages: Any) -> None:
    messages = message_list(messages)
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise invalid_type(f"messages[{i}]", "an object", message)
        if not isinstance(message.get("role"), str):
            raise InvalidRequest(f"'messages[{i}].role' is required and must be a string",
                                 param=f"messages[{i}].role", code="invalid_type")


# -- answers ---------------------------------------------------------------------------------

_CHUNK_CHARS = 64  # characters per content chunk when a stored answer is streamed


def answer_from_completion(obj: Any, allow_tools: bool) -> Answer | None:
    """The answer of a ``chat.completion`` (its body parsed) if it may be kept, else None
    (not JSON, an error, an incomplete answer, several choices, tool calls not allowed...)."""
    if not isinstance(obj, dict) or "error" in obj:
        return None
    choices = obj.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return None
    message = choices[0].get("message")
    if not isinstance(message, dict):
        return None
    usage = obj.get("usage")
    return Answer.complete(message.get("content"), str(choices[0].get("finish_reason")),
                           str(obj.get("model", "")), message.get("tool_calls"),
                           usage if isinstance(usage, dict) else None, allow_tools)


class AnswerCollector:
    """Rebuilds the answer of a chunk stream from its events. The blocks of whole events are
    kept as they are sent (``feed`` is the list's own ``append``: no Python work per block on
    the relay's path) and read once, by :meth:`answer`."""

    __slots__ = ("_blocks", "feed")

    def __init__(self) -> None:
        self._blocks: list[bytes] = []
        #: Take a block of whole SSE events.
        self.feed: Callable[[bytes], None] = self._blocks.append

    def answer(self, finish: str | None, usage: dict[str, Any] | None) -> Answer | None:
        """The whole answer, or None when it may not be kept (an unreadable chunk, another
        choice than the first, streamed tool calls: they are not reassembled)."""
        if finish != "stop":
            return None
        chunks = _chunks(self._blocks)
        if chunks is None:
            return None
        content: list[str] = []
        model = ""
        try:
            for obj in chunks:
                model = obj.get("model") or model
                for choice in obj.get("choices") or ():
                    if choice.get("index", 0) != 0:
                        return None  # n > 1: not one answer
                    delta = choice.get("delta") or {}
                    if delta.get("content"):
                        content.append(delta["content"])
                    if delta.get("tool_calls"):
                        return None
        except (AttributeError, TypeError):  # a chunk not shaped as one: nothing to keep
            return None
        return Answer.complete("".join(content), finish, model, None, usage, False)


def _chunks(blocks: list[bytes]) -> list[Any] | None:
    """The stream's ``data: {...}`` events parsed (others skipped), or None when one is not
    JSON. A stream framed as OpenAI sends it (each event one ``data:`` line, ``[DONE]``
    last) is cut by one split and parsed by ``map``; any other is read event by event."""
    data = b"".join(blocks)
    if data[-_END_LEN:] == _END:  # [DONE], an event of its own, last
        data = data[:2 - _END_LEN]
    elif data == DONE:
        return []
    try:
        # Every newline is one of an event's two ending ones: each event is one data line
        # holding an object.
        if data.startswith(b"data: {") and data.endswith(b"\n\n") \
                and data.count(10) == 2 * data.count(b"\n\ndata: {") + 2:
            return list(map(orjson.loads, data[6:-2].split(b"\n\ndata: ")))
        return [orjson.loads(event[6:]) for block in blocks for event in block.split(b"\n\n")
                if event.startswith(b"data: {")]
    except orjson.JSONDecodeError:
        return None


def _usage(answer: Answer) -> dict[str, Any]:
    prompt = answer.prompt_tokens or 0
    completion = answer.completion_tokens or 0
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": prompt}}


def completion_body(answer: Answer, id_: str | None = None) -> bytes:
    """A ``chat.completion`` JSON body for ``answer`` (its prompt counted as cached)."""
    message: dict[str, Any] = {"role": "assistant", "content": answer.content, "refusal": None}
    if answer.tool_calls:
        message["tool_calls"] = answer.tool_calls
    return orjson.dumps({
        "id": id_ or "chatcmpl-" + random_hex(), "object": "chat.completion",
        "created": int(time.time()), "model": answer.model,
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": answer.finish_reason}],
        "usage": _usage(answer),
    })


def completion_events(answer: Answer, include_usage: bool, id_: str | None = None) -> bytes:
    """The whole chunk stream of ``answer``, ``[DONE]`` included (one write: it is
    already complete)."""
    base = {"id": id_ or "chatcmpl-" + random_hex(), "object": "chat.completion.chunk",
            "created": int(time.time()), "model": answer.model}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return json_event({**base, "choices": [
            {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]})

    out = [chunk({"role": "assistant", "content": ""})]
    content = answer.content or ""
    for i in range(0, len(content), _CHUNK_CHARS):
        out.append(chunk({"content": content[i:i + _CHUNK_CHARS]}))
    if answer.tool_calls:
        out.append(chunk({"tool_calls": [{**c, "index": i}
                                         for i, c in enumerate(answer.tool_calls)]}))
    out.append(chunk({}, answer.finish_reason))
    if include_usage:
        out.append(json_event({**base, "choices": [], "usage": _usage(answer)}))
    out.append(DONE)
    return b"".join(out)


# -- errors ----------------------------------------------------------------------------------

def error_body(error: GatewayError) -> bytes:
    """``{"error": {message, type, param, code}}`` for ``error`` (bytes)."""
    return error.body()


def error_event(error: GatewayError) -> bytes:
    """An SSE event carrying the OpenAI error object; the openai SDK raises on it."""
    return data_event(error_body(error))


def with_usage_option(raw: bytes) -> bytes:
    """A Chat Completions request body (JSON bytes, an object without ``stream_options``)
    with ``"stream_options":{"include_usage":true}`` as its first key: the client's bytes
    otherwise untouched, nothing parsed or serialised again."""
    body = raw.lstrip()
    return b'{"stream_options":{"include_usage":true},' + body[1:]
