"""Continuation after a mid-stream failure (issue 48, item 3; policy ``[stream_watch]``'s
``max_continuations``, ``continue_upstreams``, ``prefill_models``, ``equivalent_models``).

Once an answer's text has reached the client, a stream that breaks (a cut connection, no
end event), stalls (:class:`~gateway.errors.UpstreamStalled`, :mod:`gateway.stream_watch`)
or sends an in-band error event is sent again, to the same model on another target (or the
same one), with the text already sent as the final assistant message, where the target can
continue the very text it is given:

- OpenAI-compatible servers that take ``continue_final_message: true`` with
  ``add_generation_prompt: false`` (vLLM, SGLang; https://docs.vllm.ai/en/latest/serving/
  openai_compatible_server.html#chat-api), named in ``continue_upstreams``;
- Anthropic models that take an assistant prefill (``prefill_models``, patterns; none with
  extended thinking; Claude 4.6 and later refuse a prefill; a prefill may not end in
  whitespace: https://docs.anthropic.com/en/docs/build-with-claude/prefill-claudes-response):
  the text's trailing whitespace is held back from the prefill and dropped from the start
  of what the continuation sends, where it repeats it.

Only what follows is relayed (:class:`Continuing`, in the upstream's wire format, before
any translation for the client): the continuation's opening events (role chunk,
``message_start``, the open text block's ``content_block_start``) are dropped, its chunk
ids and block indexes made the first attempt's, its usage summed with what the cut
attempts spent (their completion tokens counted as their content events, a token each on
OpenAI-compatible servers; an OpenAI-compatible attempt's prompt, never reported for a cut
stream, estimated as the continuation's less the text it was sent), ``max_tokens`` lowered
by what was spent. So the client reads one answer: one role chunk, one ``message_start``,
one ``response.created``, one finish. Never inside a tool call or a reasoning/thinking
block, never on another model unless ``equivalent_models`` groups them, at most
``max_continuations`` times a request, each one spending a retry-budget token: otherwise
the stream ends with the failure as an error event in the client's format, as without
continuation. Counted in the log's ``continued`` and
``gateway_stream_continuations_total{upstream}`` (the upstream whose stream failed).
"""

from __future__ import annotations

import fnmatch
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from gateway.concurrency import Shed
from gateway.config import Target
from gateway.context import RequestContext, Stream
from gateway.errors import GatewayError, UpstreamError
from gateway.formats.bridge import TranslatedStream
from gateway.formats.translator import Translator
from gateway.models import model_key
from gateway.upstreams.base import Upstream, UpstreamRequest, WholeResponse
from llm_wire.sse import cut_events, parse_event

if TYPE_CHECKING:
    from gateway.dispatch import Dispatcher, Opened
    from gateway.outbound import Outbound
    from gateway.stream_watch_policy import StreamWatchPolicy

__all__ = ["Continuing", "client_stream", "continuing", "method_of"]

_BLOCKING = ("tool_calls", "function_call", "reasoning_content", "reasoning", "refusal")
_CONTINUED_PATHS = ("/chat/completions", "/messages")  # not legacy completions


def method_of(policy: StreamWatchPolicy, upstream: Upstream, model: str) -> str | None:
    """How ``model`` on ``upstream`` continues a text: ``"continue"``
    (continue_final_message: the local engine, the policy's ``continue_upstreams``),
    ``"prefill"`` (an Anthropic model of ``prefill_models``) or None."""
    if upstream.api == "anthropic":
        return "prefill" if any(fnmatch.fnmatchcase(model, p) for p in policy.prefill_models) \
            else None
    return "continue" if upstream.continues_final_message \
        or upstream.name in policy.continue_upstreams else None


def client_stream(opened: Opened, dispatcher: Dispatcher, bodies: Outbound,
                  ctx: RequestContext, target: Target, targets: Sequence[Target],
                  early: Translator | None) -> Stream:
    """What the relay sends of ``opened``: :func:`continuing`, translated for the client
    where ``target``'s API is not the client's (``early``: its translator, made ahead)."""
    inner = continuing(opened, dispatcher, bodies, ctx, target, targets)
    crossing = bodies.crossing(target)
    return inner if crossing is None else \
        TranslatedStream(inner, early or crossing.stream(ctx.body))


def continuing(opened: Opened, dispatcher: Dispatcher, bodies: Outbound, ctx: RequestContext,
               target: Target, targets: Sequence[Target]) -> Stream:
    """``opened`` (the stream of ``target``, one of the route's ``targets``) as a stream
    that continues after a failure where the policy and the target allow, else itself."""
    policy, route = ctx.policy.stream_watch, ctx.route
    key = None if route is None or not policy.models else model_key(route.name, route,
                                                                      policy.models)
    limit = policy.rule(key).max_continuations
    upstream = dispatcher.upstreams[target.upstream]
    if not limit or (upstream.native_responses and ctx.api.name == "responses") \
            or method_of(policy, upstream, target.model) is None \
            or not bodies.request(target).path.endswith(_CONTINUED_PATHS):
        return opened
    return Continuing(opened, _Plan(dispatcher, bodies, ctx, target, targets, limit,
                                    upstream.api, policy))


@dataclass(slots=True)
class _Plan:
    dispatcher: Dispatcher
    bodies: Outbound
    ctx: RequestContext
    target: Target
    targets: Sequence[Target]
    limit: int
    api: str
    policy: StreamWatchPolicy


class _Broken(Exception):
    """An in-band error event: the attempt failed (its event is not relayed)."""


class Continuing:
    """An answering stream (the :class:`~gateway.context.Stream` protocol) that, on a
    failure, continues on another attempt and relays only what follows (module doc)."""

    def __init__(self, opened: Opened, plan: _Plan) -> None:
        self._plan, self._current, self._target = plan, opened, plan.target
        self._rest = b""
        self.text = ""  # the answer's text the client has had
        self.blocked: str | None = None  # why it cannot be continued
        self.ended = self.finished = False
        self.continued = 0
        self._id: Any = None  # the first attempt's chunk id
        self._spent: list[tuple[int | None, int]] = []  # (prompt, completion) of cut attempts
        self._attempt_prompt: int | None = None
        self._events = 0  # content events of the current attempt
        self._follow = False  # relaying a continuation
        self._skip_ws = ""  # whitespace held back from a prefill, to drop once repeated
        self._offset, self._drop_start, self._open = 0, False, -1
        self._blocks = 0  # Anthropic content blocks the client has had
        self.first, self._failure = self._taken(opened.first)
        self.chunks: AsyncIterator[bytes] = self._chunks()

    async def _chunks(self) -> AsyncIterator[bytes]:
        failure = self._failure
        while True:
            if failure is not None:  # raises it where no continuation can follow
                out, failure = await self._continue(failure)
                if out:
                    yield out
                continue
            try:
                chunk = await self._current.chunks.__anext__()
            except StopAsyncIteration:
                if self.ended:
                    return
                failure = UpstreamError("the upstream ended the stream before its end event")
            except UpstreamError as exc:
                failure = exc
            else:
                out, failure = self._taken(chunk)
                if out:
                    yield out

    def _taken(self, chunk: bytes) -> tuple[bytes, UpstreamError | None]:
        """What of ``chunk`` goes out, and the in-band error event that failed it, if any."""
        try:
            return self._feed(chunk), None
        except _Broken as exc:
            self._rest = b""
            return exc.args[0], UpstreamError("the upstream sent an error event mid-stream")

    async def _continue(self, failure: UpstreamError
                        ) -> tuple[bytes, UpstreamError | None]:
        """The next attempt, its opening read (what of it goes to the client returned, and
        its own failure if any); raises ``failure`` where no continuation can follow."""
        plan = self._plan
        dispatcher, ctx = plan.dispatcher, plan.ctx
        if self.blocked or self.finished or not self.text or self.continued >= plan.limit \
                or (plan.api == "anthropic" and _thinking(plan.bodies.request(self._target))):
            raise failure
        candidates = [t for t in (*[t for t in plan.targets if t is not self._target],
                                  self._target) if self._can(t)]
        method = "prefill" if plan.api == "anthropic" else "continue"
        text = self.text.rstrip() if method == "prefill" else self.text
        if not text or not candidates or not dispatcher.budget.withdraw():
            raise failure  # (only whitespace so far: no prefill to give)
        self._current.close(True)
        cut = self._target.upstream
        counts = dispatcher.watch.continued
        counts[cut] = counts.get(cut, 0) + 1
        self.continued += 1
        ctx.record.continued += 1
        self._spent.append((self._attempt_prompt, self._events))
        self._attempt_prompt, self._events = None, 0
        self._skip_ws = self.text[len(text):]
        spent = sum(c for _, c in self._spent)
        try:
            target, result = await dispatcher.stream(
                candidates, lambda t: _resent(plan.bodies.request(t), method, text, spent),
                ctx)
        except (GatewayError, Shed) as exc:  # no target could take it: the stream ends
            raise failure from exc
        if isinstance(result, WholeResponse):  # refused with a status
            raise failure
        self._current, self._target, self._follow = result, target, True
        if plan.api == "anthropic":  # the open text block goes on; a closed one is followed
            self._drop_start = self._open >= 0
            self._offset = self._open if self._open >= 0 else self._blocks
        self._rest = b""
        return self._taken(result.first)

    def _can(self, target: Target) -> bool:
        plan = self._plan
        upstream = plan.dispatcher.upstreams[target.upstream]
        same = target.model == self._target.model or any(
            target.model in group and self._target.model in group
            for group in plan.policy.equivalent_models)
        return same and upstream.enabled and upstream.api == plan.api \
            and method_of(plan.policy, upstream, target.model) is not None

    # -- events ------------------------------------------------------------------------

    def _feed(self, chunk: bytes) -> bytes:
        """``chunk``'s whole events as they go to the client (the rest kept for the next);
        raises _Broken (with what goes out before it) on an error event."""
        block, self._rest = cut_events(self._rest + chunk)
        if not block:
            return b""
        out = []
        for raw in block[:-2].split(b"\n\n"):
            name, data = parse_event(raw)
            if not data and name is None:
                out.append(raw + b"\n\n")  # a comment
                continue
            try:
                kept = self._anthropic(name, data, raw) if self._plan.api == "anthropic" \
                    else self._openai(data, raw)
            except _Broken:
                raise _Broken(b"".join(out)) from None
            if kept is not None:
                out.append(kept + b"\n\n")
        return b"".join(out)

    def _openai(self, data: bytes, raw: bytes) -> bytes | None:
        if data == b"[DONE]":
            self.ended = True
            return raw
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return raw
        if not isinstance(obj, dict):
            return raw
        if "error" in obj:
            raise _Broken
        if self._id is None:
            self._id = obj.get("id")
        changed = False
        for choice in obj.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta")
            if choice.get("index", 0) != 0:
                self.blocked = "choices"
            if choice.get("finish_reason") is not None:
                self.finished = True
            if not isinstance(delta, dict):
                continue
            if any(delta.get(k) for k in _BLOCKING):
                self.blocked = self.blocked or "tool_call_or_reasoning"
            if self._follow and "role" in delta:
                del delta["role"]
                changed = True
            content = delta.get("content")
            if isinstance(content, str) and content:
                if self._skip_ws:
                    delta["content"] = content = self._skip(content)
                    changed = True
                self.text += content
                self._events += 1
        if not self._follow:
            return raw
        if (choices := obj.get("choices")) and not obj.get("usage") and all(
                isinstance(c, dict) and c.get("finish_reason") is None
                and not any((c.get("delta") or {}).values()) for c in choices):
            return None  # the continuation's role chunk
        if obj.get("id") != self._id:
            obj["id"], changed = self._id, True
        usage = obj.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
            self._sum_openai(usage)
            changed = True
        return b"data: " + orjson.dumps(obj) if changed else raw

    def _sum_openai(self, usage: dict[str, Any]) -> None:
        now, completion = usage["prompt_tokens"], int(usage.get("completion_tokens") or 0)
        before = sum(c for _, c in self._spent)
        base, prompts, so_far = max(now - before, 0), 0, 0
        for prompt, spent in self._spent:  # each cut attempt's prompt: the first's + text
            prompts += prompt if prompt is not None else base + so_far
            so_far += spent
        usage["prompt_tokens"] = now + prompts
        usage["completion_tokens"] = completion + before
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]

    def _anthropic(self, name: str | None, data: bytes, raw: bytes) -> bytes | None:
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return raw
        kind = name or (obj.get("type") if isinstance(obj, dict) else None)
        if not isinstance(obj, dict) or kind in ("ping", None):
            return raw
        if kind == "error":
            raise _Broken
        if kind == "message_start":
            usage = (obj.get("message") or {}).get("usage") or {}
            if isinstance(usage.get("input_tokens"), int):
                self._attempt_prompt = usage["input_tokens"]
            return None if self._follow else raw
        if kind == "message_stop":
            self.ended = True
            return raw
        if kind == "message_delta":
            self.finished = True
            usage = obj.get("usage")
            if self._follow and isinstance(usage, dict):
                usage["output_tokens"] = int(usage.get("output_tokens") or 0) + sum(
                    c for _, c in self._spent)
                now = self._attempt_prompt or 0
                usage["input_tokens"] = now + sum(p or 0 for p, _ in self._spent)
                return _event(kind, obj)
            return raw
        index = obj.get("index")
        if not isinstance(index, int):
            return raw
        if kind == "content_block_start":
            block = obj.get("content_block") or {}
            if block.get("type") != "text":
                self.blocked = self.blocked or "tool_use_or_thinking"
            if self._follow and self._drop_start and index == 0:
                return None
            self._open = index + self._offset if self._follow else index
            self._blocks = max(self._blocks, self._open + 1)
        elif kind == "content_block_stop":
            self._open = -1
        elif kind == "content_block_delta":
            delta = obj.get("delta") or {}
            if delta.get("type") != "text_delta":
                self.blocked = self.blocked or "tool_use_or_thinking"
            elif isinstance(text := delta.get("text"), str):
                if self._skip_ws:
                    delta["text"] = text = self._skip(text)
                self.text += text
                self._events += 1
        if self._follow:
            obj["index"] = index + self._offset
            return _event(kind, obj)
        return raw

    def _skip(self, text: str) -> str:
        """``text`` without the start that repeats the whitespace held back from a prefill."""
        ws, n = self._skip_ws, 0
        while n < len(ws) and n < len(text) and text[n] == ws[n]:
            n += 1
        self._skip_ws = ws[n:] if n == len(text) else ""
        return text[n:]

    # -- the Stream protocol ---------------------------------------------------------------

    async def finish(self) -> None:
        await self._current.finish()

    def close(self, failed: bool = False) -> None:
        self._current.close(failed)


def _event(name: str, obj: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(obj)


def _thinking(request: UpstreamRequest) -> bool:
    """Whether an Anthropic request has extended thinking on (then no prefill)."""
    thinking = orjson.loads(request.body).get("thinking")
    return isinstance(thinking, dict) and thinking.get("type") != "disabled"


def _resent(request: UpstreamRequest, method: str, text: str, spent: int) -> UpstreamRequest:
    """``request`` again, with ``text`` as the final assistant message to continue, and
    ``max_tokens`` less the ``spent`` tokens (never under 1)."""
    body = orjson.loads(request.body)
    messages = list(body.get("messages") or [])
    last = messages[-1] if messages else None
    if isinstance(last, dict) and last.get("role") == "assistant" \
            and isinstance(last.get("content"), str):  # the client's own prefill, extended
        messages[-1] = {**last, "content": last["content"] + text}
    else:
        messages.append({"role": "assistant", "content": text})
    body["messages"] = messages
    if method == "continue":
        body["continue_final_message"], body["add_generation_prompt"] = True, False
    for key in ("max_tokens", "max_completion_tokens"):
        if isinstance(body.get(key), int):
            body[key] = max(1, body[key] - spent)
    return UpstreamRequest(request.method, request.path, orjson.dumps(body), request.headers,
                           request.stream, request.request_id)
