"""OpenAI wire format <-> engine calls: request validation and response/chunk building.

Pure functions, no I/O. Shapes follow the OpenAI API reference for chat completions
(https://platform.openai.com/docs/api-reference/chat), embeddings and legacy completions
(https://platform.openai.com/docs/api-reference/completions), which the engine serves for
scoring only: ``echo: true`` with ``max_tokens: 0`` returns each prompt token's
log-probability (``logprobs: 0``), as vLLM and OpenAI's older models do. Bad input raises
:class:`local_engine.errors.InvalidRequest` naming the offending ``param``.
"""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llm_wire.sse import json_event
from local_engine.errors import InvalidRequest
from local_engine.sequence import SamplingParams
from local_engine.structured import Structured, parse_structured
from local_engine.tool_calls import render_call, tools_prompt

__all__ = [
    "MAX_SCORE_PROMPTS",
    "ChatRequest",
    "ScoreRequest",
    "chat_chunk",
    "chat_completion",
    "embeddings_response",
    "encode_chat",
    "parse_chat",
    "parse_embeddings",
    "parse_score",
    "score_response",
    "usage",
]

#: Prompts one scoring request may hold.
MAX_SCORE_PROMPTS = 256

_ROLES = {"system", "developer", "user", "assistant", "tool"}


@dataclass(frozen=True)
class ChatRequest:
    """``messages`` as the chat template takes them (tools and calls written in, see
    :mod:`local_engine.tool_calls`); ``structured``: the output's grammar and whether it is
    parsed for tool calls."""

    model: str
    messages: list[dict[str, str]]
    params: SamplingParams
    stream: bool
    include_usage: bool
    structured: Structured = field(default_factory=Structured)
    #: ``continue_final_message``: the answer continues the last (assistant) message's
    #: text instead of starting a new one (vLLM's and SGLang's parameter).
    continue_final: bool = False


def _number(body: dict[str, Any], key: str, default: float, lo: float, hi: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise InvalidRequest(f"'{key}' must be a number between {lo} and {hi}", param=key)
    return float(value)


def _content(message: dict[str, Any], i: int) -> str:
    content = message.get("content")
    if content is None and message.get("role") == "assistant":
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: only text ones can be served here
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" \
                    or not isinstance(part.get("text"), str):
                raise InvalidRequest("only text content parts are supported by the local "
                                     "engine", param=f"messages[{i}].content")
            parts.append(part["text"])
        return "".join(parts)
    raise InvalidRequest("'content' must be a string or a list of text parts",
                         param=f"messages[{i}].content")


def parse_chat(body: Any, default_max_tokens: int) -> ChatRequest:
    """Validate a chat completions request body (parsed JSON). ``max_tokens`` (or
    ``max_completion_tokens``) defaults to ``default_max_tokens``."""
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty array", param="messages")
    chat: list[dict[str, str]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise InvalidRequest(f"each message needs a 'role', one of {sorted(_ROLES)}",
                                 param=f"messages[{i}].role")
        role = "system" if m["role"] == "developer" else m["role"]
        chat.append({"role": role, "content": _content(m, i) + _calls(m, i)})
    structured = parse_structured(body)
    if structured.functions:
        chat = _with_tools(chat, tools_prompt(list(structured.functions)))
    n = body.get("n")
    if n not in (None, 1):
        raise InvalidRequest("the local engine supports only n = 1", param="n")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is None:
        max_tokens = default_max_tokens
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise InvalidRequest("'max_tokens' must be a positive integer", param="max_tokens")
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,) if stop else ()
    elif isinstance(stop, list) and len(stop) <= 4 and all(isinstance(s, str) and s
                                                           for s in stop):
        stops = tuple(stop)
    else:
        raise InvalidRequest("'stop' must be a string or up to 4 non-empty strings",
                             param="stop")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise InvalidRequest("'seed' must be an integer", param="seed")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidRequest("'stream' must be a boolean", param="stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise InvalidRequest("'stream_options' must be an object", param="stream_options")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' must be a non-empty string", param="model")
    params = SamplingParams(
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0) or 1e-6,
        max_tokens=max_tokens, stop=stops, seed=seed,
    )
    return ChatRequest(model, chat, params, stream, bool(options.get("include_usage")),
                       structured, _continue_final(body, chat))


def _continue_final(body: dict[str, Any], chat: list[dict[str, str]]) -> bool:
    """``continue_final_message`` (with ``add_generation_prompt: false``, as vLLM takes
    them): the last message must be the assistant's to continue."""
    go_on, prompt = body.get("continue_final_message", False), body.get(
        "add_generation_prompt", True)
    if not isinstance(go_on, bool) or not isinstance(prompt, bool):
        raise InvalidRequest("'continue_final_message' and 'add_generation_prompt' must be "
                             "booleans", param="continue_final_message")
    if go_on and (prompt and "add_generation_prompt" in body or chat[-1]["role"] != "assistant"):
        raise InvalidRequest("'continue_final_message' needs the last message to be the "
                             "assistant's and 'add_generation_prompt' false",
                             param="continue_final_message")
    return go_on


def _calls(message: dict[str, Any], i: int) -> str:
    """An assistant message's ``tool_calls`` in the model's call syntax, after its text."""
    calls = message.get("tool_calls") if message.get("role") == "assistant" else None
    if not calls:
        return ""
    if not isinstance(calls, list):
        raise InvalidRequest("'tool_calls' must be an array", param=f"messages[{i}].tool_calls")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) \
                or not isinstance(fn.get("arguments", ""), str):
            raise InvalidRequest("a tool call needs a function 'name' and 'arguments' (a JSON "
                                 "text)", param=f"messages[{i}].tool_calls[{j}].function")
        out.append(render_call(fn["name"], fn.get("arguments") or "{}"))
    text = "\n".join(out)
    return "\n" + text if message.get("content") else text


def _with_tools(chat: list[dict[str, str]], section: str) -> list[dict[str, str]]:
    """The tools section at the end of the first system message (one added if none)."""
    if chat[0]["role"] == "system":
        return [{"role": "system", "content": chat[0]["content"] + "\n\n" + section},
                *chat[1:]]
    return [{"role": "system", "content": section}, *chat]


def encode_chat(tokenizer: Any, messages: list[dict[str, str]],
                continue_final: bool = False) -> list[int]:
    """The prompt's token ids: ``messages`` (as :func:`parse_chat` gives them) through the
    tokenizer's chat template, ready for an answer (``continue_final``: ready to go on with
    the last message's text, the template's ``continue_final_message``). The gateway's
    prefix_precise routing calls it too, to compute the very block hashes this engine
    caches."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=False,
                                        continue_final_message=True, tokenize=True) \
        if continue_final else \
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # BatchEncoding
        ids = ids["input_ids"]
    return list(ids)


def usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def chat_completion(id_: str, model: str, created: int, text: str, finish_reason: str,
                    usage_: dict[str, Any],
                    tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A ``chat.completion``; with ``tool_calls`` its content is null when there is no text
    and ``finish_reason`` "stop" becomes "tool_calls", as OpenAI answers."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        message = {"role": "assistant", "content": text or None, "tool_calls": tool_calls}
        finish_reason = "tool_calls" if finish_reason == "stop" else finish_reason
    return {
        "id": id_, "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": 0, "message": message,
                     "logprobs": None, "finish_reason": finish_reason}],
        "usage": usage_,
    }


def chat_chunk(id_: str, model: str, created: int, delta: dict[str, Any] | None,
               finish_reason: str | None = None,
               usage_: dict[str, Any] | None = None) -> bytes:
    """One SSE event. ``delta=None`` makes the final usage-only chunk (empty choices)."""
    choices = [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None,
                                         "finish_reason": finish_reason}]
    obj: dict[str, Any] = {"id": id_, "object": "chat.completion.chunk", "created": created,
                           "model": model, "choices": choices}
    if usage_ is not None:
        obj["usage"] = usage_
    return json_event(obj)


def _model_of(body: Any) -> str:
    """``model`` of a request body, which must be a JSON object."""
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' must be a non-empty string", param="model")
    return model


def parse_embeddings(body: Any) -> tuple[str, list[str], str]:
    """(model, texts, encoding_format) of an embeddings request; token-array inputs are
    not supported (the tokenizer is the model's own)."""
    model = _model_of(body)
    value = body.get("input")
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise InvalidRequest("'input' must be a string or a non-empty array of strings",
                             param="input")
    if len(texts) > 2048:
        raise InvalidRequest("'input' may hold at most 2048 strings", param="input")
    fmt = body.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise InvalidRequest("'encoding_format' must be 'float' or 'base64'",
                             param="encoding_format")
    return model, texts, fmt


def embeddings_response(model: str, vectors: np.ndarray, fmt: str,
                        tokens: int) -> dict[str, Any]:
    """``base64``: the little-endian float32 bytes, as the openai SDK decodes them."""
    data = []
    for i, row in enumerate(vectors):
        value: Any = (base64.b64encode(row.astype("<f4").tobytes()).decode()
                      if fmt == "base64" else row.tolist())
        data.append({"object": "embedding", "index": i, "embedding": value})
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


@dataclass(frozen=True)
class ScoreRequest:
    """A legacy completions request the engine serves: ``prompts`` echoed with their
    tokens' log-probabilities (``logprobs``) or without (False)."""

    model: str
    prompts: list[str]
    logprobs: bool


def parse_score(body: Any) -> ScoreRequest:
    """Validate a legacy completions body: ``prompt`` a string or a non-empty array of up
    to :data:`MAX_SCORE_PROMPTS` non-empty strings, ``echo: true``, ``max_tokens: 0``,
    ``logprobs`` 0 or absent. Anything that asks for generated text is refused: the engine
    generates through chat completions only."""
    model = _model_of(body)
    value = body.get("prompt")
    prompts = [value] if isinstance(value, str) else value
    if not isinstance(prompts, list) or not prompts or not all(
            isinstance(p, str) and p for p in prompts):
        raise InvalidRequest("'prompt' must be a non-empty string or a non-empty array of "
                             "them (token arrays are not supported)", param="prompt")
    if len(prompts) > MAX_SCORE_PROMPTS:
        raise InvalidRequest(f"'prompt' may hold at most {MAX_SCORE_PROMPTS} strings",
                             param="prompt")
    if body.get("echo") is not True or body.get("max_tokens") != 0 \
            or isinstance(body.get("max_tokens"), bool):
        raise InvalidRequest("the local engine serves /v1/completions for scoring only "
                             "('echo': true, 'max_tokens': 0); generate with "
                             "/v1/chat/completions", param="max_tokens")
    logprobs = body.get("logprobs")
    if logprobs is not None and (isinstance(logprobs, bool) or logprobs != 0):
        raise InvalidRequest("'logprobs' must be 0 (each prompt token's own "
                             "log-probability; no alternatives are served)", param="logprobs")
    if body.get("n") not in (None, 1) or body.get("best_of") not in (None, 1):
        raise InvalidRequest("the local engine supports only n = 1", param="n")
    if body.get("stream"):
        raise InvalidRequest("scoring does not stream", param="stream")
    return ScoreRequest(model, prompts, logprobs is not None)


def score_response(id_: str, request: ScoreRequest, created: int,
                   scored: list[tuple[list[int], np.ndarray]]) -> dict[str, Any]:
    """The completion object: per prompt, ``text`` (the prompt echoed) and ``logprobs``
    {``tokens`` (each token's text), ``token_logprobs`` (natural log, null for the first
    token, which has no prefix), ``top_logprobs`` (null), ``text_offset`` (the character
    in the prompt where each token starts, non-decreasing; a token inside a character
    another token began shares its offset)}. ``scored``: per prompt, the tokens' start
    offsets and their log-probabilities."""
    choices = []
    tokens = 0
    for index, (prompt, (offsets, logprobs)) in enumerate(zip(request.prompts, scored,
                                                              strict=True)):
        tokens += len(offsets)
        ends = [*offsets[1:], len(prompt)]
        info = None
        if request.logprobs:
            values = [None if math.isnan(v) else round(v, 4) for v in logprobs.tolist()]
            info = {"tokens": [prompt[a:b] for a, b in zip(offsets, ends)],
                    "token_logprobs": values, "top_logprobs": None,
                    "text_offset": list(offsets)}
        choices.append({"index": index, "text": prompt, "logprobs": info,
                        "finish_reason": "length"})
    return {"id": id_, "object": "text_completion", "created": created,
            "model": request.model, "choices": choices,
            "usage": {"prompt_tokens": tokens, "completion_tokens": 0, "total_tokens": tokens}}
