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
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import orjson

from gateway.concurrency import Shed
from gateway.config import Target
from gateway.context import RequestContext, Stream
from gateway.continued_text import InBandError, Transcript
from gateway.errors import GatewayError, UpstreamError
from gateway.formats.bridge import TranslatedStream
from gateway.formats.translator import Translator
from gateway.models import model_key
from gateway.tracing import as_continuation
from gateway.upstreams.base import Upstream, UpstreamRequest, WholeResponse

if TYPE_CHECKING:
    from gateway.outbound import Outbound
    from gateway.retry_budget import RetryBudget
    from gateway.stream_watch import StreamWatch
    from gateway.stream_watch_policy import StreamWatchPolicy

__all__ = ["Continuing", "client_stream", "continuing", "method_of"]

_CONTINUED_PATHS = ("/chat/completions", "/messages")  # not legacy completions


class Dispatcher(Protocol):
    """What a continuation uses of the dispatcher (gateway.dispatch.Dispatcher)."""

    upstreams: dict[str, Upstream]
    budget: RetryBudget
    watch: StreamWatch

    def stream(self, targets: Sequence[Target], build: Callable[[Target], UpstreamRequest],
               ctx: RequestContext, head: Callable[[str], bytes] | None = None,
               ) -> Awaitable[tuple[Target, WholeResponse | Opened]]: ...


class Opened(Stream, Protocol):
    """An upstream's answering stream (gateway.dispatch.Opened)."""


def method_of(policy: StreamWatchPolicy, upstream: Upstream, model: str) -> str | None:
    """How ``model`` on ``upstream`` continues a text: ``"continue"``
    (continue_final_message: the local engine, the policy's ``continue_upstreams``),
    ``"prefill"`` (an Anthropic model of ``prefill_models``) or None."""
    if upstream.api == "anthropic":
        return "prefill" if _prefilled(policy.prefill_models, model) else None
    return "continue" if upstream.continues_final_message \
        or upstream.name in policy.continue_upstreams else None


@functools.lru_cache(maxsize=1024)
def _prefilled(patterns: tuple[str, ...], model: str) -> bool:
    """Whether ``model`` matches one of ``patterns`` (fnmatch), remembered: asked on every
    streamed Anthropic request."""
    return any(fnmatch.fnmatchcase(model, p) for p in patterns)


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


class Continuing:
    """An answering stream (the :class:`~gateway.context.Stream` protocol) that, on a
    failure, continues on another attempt and relays only what follows (module doc)."""

    def __init__(self, opened: Opened, plan: _Plan) -> None:
        self._plan, self._current, self._target = plan, opened, plan.target
        self.continued = 0
        self._said = said = Transcript(plan.api)
        self.first, self._failure = said.taken(opened.first)
        self.chunks: AsyncIterator[bytes] = self._chunks()

    async def _chunks(self) -> AsyncIterator[bytes]:
        failure = self._failure
        while True:
            if failure is not None:  # raises it where no continuation can follow
                try:
                    out, failure = await self._continue(failure)
                except InBandError as exc:  # the upstream's own error event ends it, as
                    yield exc.event         # without continuation (its type kept)
                    return
                if out:
                    yield out
                continue
            try:
                chunk = await self._current.chunks.__anext__()
            except StopAsyncIteration:
                if self._said.ended:
                    return
                failure = UpstreamError("the upstream ended the stream before its end event")
            except UpstreamError as exc:
                failure = exc
            else:
                out, failure = self._said.taken(chunk)
                if out:
                    yield out

    async def _continue(self, failure: UpstreamError
                        ) -> tuple[bytes, UpstreamError | None]:
        """The next attempt, its opening read (what of it goes to the client returned, and
        its own failure if any); raises ``failure`` where no continuation can follow."""
        plan, said = self._plan, self._said
        dispatcher, ctx = plan.dispatcher, plan.ctx
        if said.blocked or said.finished or self.continued >= plan.limit \
                or _not_continuable(plan.bodies.request(self._target)):
            raise failure
        candidates = [t for t in (*[t for t in plan.targets if t is not self._target],
                                  self._target) if self._can(t)]
        method = "prefill" if plan.api == "anthropic" else "continue"
        said_text = said.text
        text = said_text.rstrip() if method == "prefill" else said_text
        if not text or not candidates or not dispatcher.budget.withdraw():
            raise failure  # (only whitespace so far: no prefill to give)
        self._current.close(True)
        cut = self._target.upstream
        counts = dispatcher.watch.continued
        counts[cut] = counts.get(cut, 0) + 1
        self.continued += 1
        ctx.record.continued += 1
        spent = said.cut(said_text[len(text):])
        try:
            call = dispatcher.stream(
                candidates, lambda t: _resent(plan.bodies.request(t), method, text, spent),
                ctx)
            target, result = await (call if ctx.trace is None else as_continuation(call))
        except (GatewayError, Shed) as exc:  # no target could take it: the stream ends
            raise failure from exc
        if isinstance(result, WholeResponse):  # refused with a status
            raise failure
        self._current, self._target = result, target
        said.follow()
        return said.taken(result.first)

    def _can(self, target: Target) -> bool:
        plan = self._plan
        upstream = plan.dispatcher.upstreams[target.upstream]
        same = target.model == self._target.model or any(
            target.model in group and self._target.model in group
            for group in plan.policy.equivalent_models)
        return same and upstream.enabled and upstream.api == plan.api \
            and method_of(plan.policy, upstream, target.model) is not None

    # -- the Stream protocol ---------------------------------------------------------------

    async def finish(self) -> None:
        await self._current.finish()

    def close(self, failed: bool = False) -> None:
        self._current.close(failed)


def _not_continuable(request: UpstreamRequest) -> bool:
    """Whether ``request`` rules a continuation out: Anthropic's extended thinking (no
    prefill with it), or an output constrained from its start (a JSON schema or mode,
    vLLM's guided decoding, Anthropic's structured outputs), which a continuation would
    apply to the rest alone."""
    body = orjson.loads(request.body)
    thinking, fmt = body.get("thinking"), body.get("response_format")
    return (isinstance(thinking, dict) and thinking.get("type") != "disabled") \
        or (isinstance(fmt, dict) and fmt.get("type") not in (None, "text")) \
        or bool((body.get("output_config") or {}).get("format")) \
        or any(k.startswith("guided_") or k == "structured_outputs" for k in body)


def _resent(request: UpstreamRequest, method: str, text: str, spent: int) -> UpstreamRequest:
    """``request`` again, with ``text`` as the final assistant message to continue, and
    ``max_tokens`` less the ``spent`` tokens (never under 1)."""
    body = orjson.loads(request.body)
    messages = list(body.get("messages") or [])
    last = messages[-1] if messages else None
    prefilled = method == "prefill" or body.get("continue_final_message") is True
    if prefilled and isinstance(last, dict) and last.get("role") == "assistant" \
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
