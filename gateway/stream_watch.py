"""The upstream side of a streamed answer, watched: a first-token deadline with failover, and
stall detection once the answer streams (issue 48, items 1 and 2; policy
``[stream_watch]``, :mod:`gateway.stream_watch_policy`).

**Nothing reaches the client before the first token.** A streaming attempt
(:meth:`gateway.dispatch.Dispatcher.stream`) reads its upstream's events until the first
text, tool-call or reasoning delta (:mod:`gateway.stream_events`), keeping what came before
it (OpenAI's role chunk, Anthropic's ``message_start`` and pings, Responses'
``response.created``...): only then does the attempt succeed and the relay send them, all
together. So while an attempt has produced no answer, only the stream's head (HTTP headers;
an Anthropic client's ``message_start`` made by the gateway, the same for every target) and
the gateway's own ``: keepalive`` comments have reached the client, and any failure of the
attempt (an error, a cut connection, the deadline) is a failure before the first byte:
retried, counted and failed over as one (:mod:`gateway.dispatch`).

**The first-token deadline** (:class:`Attempts`): an attempt with no first delta within its
deadline, from the attempt's start (connecting and the upstream's headers included; pings,
comments and opening events do not count), is closed (the upstream stops generating) and
fails with :class:`~gateway.errors.FirstTokenTimeout`: the request goes to the model's next
target at once, or, on its last target, tries it again after the usual backoff. The
deadline is the policy's fixed one, or the one learned from the target's recent first-token
times (:class:`~gateway.ttft_window.TtftWindow`), the shorter when both. The last attempt a
request can make (its last target's last try, or any when the retry budget is spent) has
none: cutting it would only turn a slow answer into an error; nor has the attempt after a
cut (a request is cut once at most), nor, for a while, a target whose cuts do not pay
(:meth:`StreamWatch.cut_paid`).

**Stalls**: once the answer streams, nothing but pings or comments from the upstream for
``stream_idle_timeout_ms`` (watched by the upstream response's own read timer,
:meth:`~gateway.upstreams.base.UpstreamResponse.watch_idle`: no second timer, no layer on
every chunk; bytes waiting while the relay sends to a slow client are no silence), or, where
set, fewer content events a second than ``min_tokens_per_s`` over ``pace_window_s``
(:class:`_Paced`), ends the upstream's response and raises
:class:`~gateway.errors.UpstreamStalled` where the stream is read: the relay ends the
client's stream with it as an error event in the client's format, never a clean end
(unless :mod:`gateway.continuation` continues it where the target can). Silence before the first delta is the deadline's (a
reasoning model may think silently for minutes after ``response.created``).

Counted in the log line (``first_token_timeouts``, ``stalled``) and in
``gateway_first_token_timeouts_total{upstream}``, ``gateway_stream_stalls_total{upstream,
reason}`` (:class:`StreamWatchCollector`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Sequence,
)
from functools import partial
from typing import Protocol, TypeVar

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.breaker import State
from gateway.config import Target
from gateway.context import RequestContext
from gateway.errors import FirstTokenTimeout, UpstreamError, UpstreamStalled
from gateway.guard import Guard
from gateway.metric_labels import at_zero
from gateway.models import model_key
from gateway.retry_budget import RetryBudget
from gateway.stream_events import CONTENT, END, MARKS, alive, kind_of, retryable_error
from gateway.stream_watch_policy import StreamWatchRule
from gateway.ttft_window import TtftWindow
from gateway.upstreams.base import Upstream, UpstreamResponse
from llm_wire.sse import EventReader, cut_events

__all__ = ["STALL_REASONS", "Attempts", "StreamWatch", "StreamWatchCollector"]

R = TypeVar("R")
#: gateway_stream_stalls_total{reason}.
STALL_REASONS = ("idle", "slow")


class _Dispatching(Protocol):
    """What :class:`Attempts` reads of the dispatcher (gateway.dispatch.Dispatcher)."""

    upstreams: dict[str, Upstream]
    guards: dict[str, Guard]
    budget: RetryBudget


class StreamWatch:
    """The dispatcher's: each target's recent first-token times, and the counts the metrics
    export. At most ``MAX_TARGETS`` windows (a pattern's targets follow the ids clients
    ask: the oldest window goes first)."""

    MAX_TARGETS = 1024
    CUT_OUTCOMES = 8
    CUT_OUTCOMES_UNPAID = 4
    SUSPEND_S = 600.0

    def __init__(self) -> None:
        self.windows: dict[tuple[str, str], TtftWindow] = {}
        #: upstream -> attempts cut by the first-token deadline
        self.first_token_timeouts: dict[str, int] = {}
        #: (upstream, reason) -> streams ended as stalled
        self.stalls: dict[tuple[str, str], int] = {}
        #: upstream -> its broken streams continued elsewhere (gateway.continuation)
        self.continued: dict[str, int] = {}
        #: target -> whether the attempt after each of its last cuts answered within the
        #: cut's deadline (the cut paid), and the time (monotonic s) its learned deadline is
        #: off until: see :meth:`cut_paid`
        self.cut_outcomes: dict[tuple[str, str], list[bool]] = {}
        self.suspended: dict[tuple[str, str], float] = {}

    def attempts(self, ctx: RequestContext, targets: Sequence[Target],
                 dispatching: _Dispatching) -> Attempts:
        """One streamed dispatch's attempts on ``targets``."""
        return Attempts(self, ctx, targets, dispatching)

    def sample(self, target: Target, ms: float, size: int) -> None:
        """A first token after ``ms`` on ``target`` for a request of ``size`` bytes."""
        key = (target.upstream, target.model)
        window = self.windows.get(key)
        if window is None:
            if len(self.windows) >= self.MAX_TARGETS:
                del self.windows[next(iter(self.windows))]
            window = self.windows[key] = TtftWindow()
        window.add(ms, size)

    def cut_paid(self, key: tuple[str, str], paid: bool) -> None:
        """The attempt after a cut on target ``key`` answered within the cut's deadline
        (``paid``) or not. Cutting pays where a slow first token is the attempt's bad luck
        (a busy machine: the next attempt is a fresh draw); where it is the request's own
        (a reasoning model thinking long about a hard prompt) the next attempt is as slow,
        and cutting only adds the deadline and a billed attempt. So when
        ``CUT_OUTCOMES_UNPAID`` of a target's last ``CUT_OUTCOMES`` cuts did not pay, its
        learned deadline is off for ``SUSPEND_S``, then tried again."""
        outcomes = self.cut_outcomes.get(key)
        if outcomes is None:
            if len(self.cut_outcomes) >= self.MAX_TARGETS:
                del self.cut_outcomes[next(iter(self.cut_outcomes))]
            outcomes = self.cut_outcomes[key] = []
        outcomes.append(paid)
        if len(outcomes) > self.CUT_OUTCOMES:
            del outcomes[0]
        if outcomes.count(False) >= self.CUT_OUTCOMES_UNPAID:
            outcomes.clear()
            if len(self.suspended) >= self.MAX_TARGETS:
                del self.suspended[next(iter(self.suspended))]
            self.suspended[key] = time.monotonic() + self.SUSPEND_S

    def deadline_ms(self, rule: StreamWatchRule, target: Target, size: int) -> float | None:
        """``target``'s first-token deadline (ms) for a request of ``size`` bytes under
        ``rule``: the fixed one, the learned one (unless suspended: :meth:`cut_paid`), the
        shorter of both, or None."""
        learned = None
        key = (target.upstream, target.model)
        if rule.first_token_factor > 0 and not (
                self.suspended and self.suspended.get(key, 0.0) > time.monotonic()):
            window = self.windows.get(key)
            if window is not None:
                learned = window.deadline_ms(size, rule.first_token_percentile,
                                             rule.first_token_factor,
                                             rule.first_token_floor_ms,
                                             rule.first_token_min_samples)
        fixed = rule.first_token_ms or None
        if fixed is None or learned is None:
            return fixed if learned is None else learned
        return min(fixed, learned)


class Attempts:
    """One streamed dispatch's attempts (the dispatcher's ``_run`` makes them in order):
    :meth:`timed` wraps an attempt in its first-token deadline, :meth:`opening` reads its
    stream up to the first token."""

    __slots__ = ("_cut", "_cut_at", "_dispatching", "_followed", "_quiet", "_rule", "_size",
                 "_started", "_tries", "ctx", "targets", "watch")

    def __init__(self, watch: StreamWatch, ctx: RequestContext,
                 targets: Sequence[Target], dispatching: _Dispatching) -> None:
        self.watch, self.ctx, self.targets = watch, ctx, targets
        self._dispatching = dispatching
        policy, route = ctx.policy.stream_watch, ctx.route
        self._rule = policy.rule(None if route is None or not policy.models
                                 else model_key(route.name, route, policy.models))
        self._size = len(ctx.raw)  # the prompt's size, as the learned deadline scales it
        self._tries: dict[int, int] = {}
        self._started = 0.0
        #: Whether another attempt can follow the one under way (its failures are retried).
        self._followed = False
        self._cut = False  # the attempt under way was cut at its first-token deadline
        #: The request's cut (its target, its deadline in ms), until the next first token.
        self._cut_at: tuple[tuple[str, str], float] | None = None
        rule = self._rule
        #: Nothing to watch (every deadline and timeout of the rule off): an attempt is not
        #: timed and its stream is not read ahead to the first token (as before the watch).
        self._quiet = not (rule.first_token_ms or rule.first_token_factor
                           or rule.stream_idle_timeout_ms or rule.min_tokens_per_s)

    def timed(self, attempt: Callable[[Upstream, Target], Awaitable[R]]
              ) -> Callable[[Upstream, Target], Awaitable[R]]:
        """``attempt`` under the target's first-token deadline, where another attempt could
        follow; raises FirstTokenTimeout when it passes."""
        if self._quiet:
            return attempt

        async def run(upstream: Upstream, target: Target) -> R:
            self._started = time.perf_counter()
            deadline, later = self._deadline(target)
            if deadline is None:
                return await attempt(upstream, target)
            # asyncio.timeout's way, with one timer and no context manager, and a veto: at
            # the deadline the attempt is cut only if the retry budget still has a token
            # for the attempt that follows (else it runs on: a slow answer, not an error)
            task = asyncio.current_task()
            assert task is not None
            cancelling, loop = task.cancelling(), asyncio.get_running_loop()
            self._cut = False
            timer = loop.call_at(loop.time() + deadline / 1000, self._expire, task)
            try:
                result = await attempt(upstream, target)
            except asyncio.CancelledError:
                if not self._cut or task.uncancel() > cancelling:
                    raise
            else:
                if self._cut:
                    task.uncancel()
                return result
            finally:
                timer.cancel()
            watch = self.watch
            watch.sample(target, deadline, self._size)  # at least that long: a lower bound
            name = target.upstream
            watch.first_token_timeouts[name] = watch.first_token_timeouts.get(name, 0) + 1
            self.ctx.record.first_token_timeouts += 1
            self._cut_at = ((name, target.model), deadline)
            raise FirstTokenTimeout(f"upstream {name!r} sent no first token within "
                                    f"{deadline:.0f} ms", next_target=later)
        return run

    def _expire(self, task: asyncio.Task[object]) -> None:
        """The first-token deadline passed: cut the attempt, where another may follow."""
        if self._dispatching.budget.tokens >= 1.0:
            self._cut = True
            task.cancel()

    def _deadline(self, target: Target) -> tuple[float | None, bool]:
        """The attempt's deadline (None: none, as for the last attempt the request can make)
        and whether another target could take the request after this one."""
        dispatching, targets = self._dispatching, self.targets
        at = 0 if targets[0] is target else next(
            i for i, t in enumerate(targets) if t is target)
        tries = self._tries[at] = self._tries.get(at, 0) + 1
        later = False
        for t in targets[at + 1:]:
            if dispatching.upstreams[t.upstream].enabled \
                    and dispatching.guards[t.upstream].breaker.state != State.OPEN:
                later = True
                break
        more = later or tries < self.ctx.policy.retry.max_attempts
        self._followed = more and dispatching.budget.tokens >= 1.0
        if not self._followed or self.ctx.record.first_token_timeouts:
            return None, later  # (one cut a request: the attempt after it runs to its end)
        return self.watch.deadline_ms(self._rule, target, self._size), later

    async def opening(self, response: UpstreamResponse, target: Target
                      ) -> tuple[AsyncIterator[bytes], bytes]:
        """Read ``response``'s stream up to and including the event that holds its first
        text, tool-call or reasoning delta (or ends it); returns the rest of the stream,
        watched for stalls from then on, and what was read (to be sent as one). With
        nothing to watch, only the first chunk is read (an attempt failing before it is
        still retried)."""
        if self._quiet:
            chunks = response.iter_chunks()
            return chunks, await anext(chunks, b"")
        upstream = self._dispatching.upstreams[target.upstream]
        api = "responses" if upstream.native_responses and self.ctx.api.name == "responses" \
            else upstream.api
        rule = self._rule
        idle_s = rule.stream_idle_timeout_ms / 1000
        chunks = response.iter_chunks(idle_s)
        reader, parts, rest, marks = EventReader(), [], b"", MARKS.get(api)
        async for chunk in chunks:
            parts.append(chunk)
            block, rest = cut_events(rest + chunk if rest else chunk)
            if not block:
                continue  # no whole event yet
            if marks is not None:  # the events before the first marked one are openings
                found = marks.search(block)  # and pings: not parsed
                if found is None:
                    continue
                at = block.rfind(b"\n\n", 0, found.start())
                if at >= 0:
                    block = block[at + 2:]
            for event in reader.feed(block):
                kind = kind_of(api, event)
                if kind >= CONTENT:  # the answer, or its end: an empty answer, an error
                    if kind == END and self._followed:
                        # an in-band error before any answer: a failure before the first
                        # byte, retried (the last attempt's goes to the client as it is)
                        failed = retryable_error(api, event)
                        if failed is not None:
                            raise UpstreamError(f"upstream {target.upstream!r} sent an error "
                                                f"event before its first token ({failed})")
                    if kind == CONTENT:
                        ms = (time.perf_counter() - self._started) * 1000
                        self.watch.sample(target, ms, self._size)
                        if self._cut_at is not None:  # did the request's cut pay?
                            self.watch.cut_paid(self._cut_at[0], ms < self._cut_at[1])
                            self._cut_at = None
                        if idle_s:  # watched by the chunks' own timer
                            response.watch_idle(idle_s, partial(self.stalled, target, "idle"))
                        if rule.min_tokens_per_s:
                            chunks = _Paced(chunks, response, self, target, rule)
                    return chunks, b"".join(parts)
        return chunks, b"".join(parts)

    def stalled(self, target: Target, reason: str) -> None:
        """A stream of ``target`` stalled (``reason``: one of STALL_REASONS)."""
        key = (target.upstream, reason)
        self.watch.stalls[key] = self.watch.stalls.get(key, 0) + 1
        self.ctx.record.stalled = reason


class _Paced:
    """The rest of an answering stream's chunks, held to ``rule``'s minimum pace: content
    events per second of waiting for the upstream (time the relay spends sending to a slow
    client is not the upstream's), over each ``pace_window_s`` of it."""

    __slots__ = ("_attempts", "_events", "_inner", "_loop", "_min_rate", "_response",
                 "_target", "_waited", "_window_s", "stalled")

    def __init__(self, inner: AsyncIterator[bytes], response: UpstreamResponse,
                 attempts: Attempts, target: Target, rule: StreamWatchRule) -> None:
        self._inner, self._response = inner, response
        self._attempts, self._target = attempts, target
        self._loop = asyncio.get_running_loop()
        self._min_rate, self._window_s = rule.min_tokens_per_s, rule.pace_window_s
        self._waited = 0.0
        self._events = 0
        #: Set once the stream fell under the pace.
        self.stalled = False

    def __aiter__(self) -> _Paced:
        return self

    async def __anext__(self) -> bytes:
        if self.stalled:
            name = self._target.upstream
            raise UpstreamStalled(f"upstream {name!r} stalled: under {self._min_rate:g} "
                                  f"tokens/s over {self._window_s:g} s", reason="slow")
        began = self._loop.time()
        chunk = await self._inner.__anext__()
        self._waited += self._loop.time() - began
        self._events += alive(chunk)
        if self._waited >= self._window_s:
            if self._events / self._waited < self._min_rate:  # this chunk still goes out;
                self.stalled = True                          # the next read raises
                self._attempts.stalled(self._target, "slow")
                self._response.close()  # the upstream stops
            self._waited, self._events = 0.0, 0
        return chunk


class StreamWatchCollector(Collector):
    """``gateway_first_token_timeouts_total{upstream}`` and
    ``gateway_stream_stalls_total{upstream,reason}``, at 0 for each configured upstream
    (and reason) from start-up; labels only from the config (bounded)."""

    def __init__(self, watch: StreamWatch, upstreams: Iterable[str]) -> None:
        self._watch = watch
        self._upstreams = list(upstreams)

    def collect(self) -> Iterator[Metric]:
        watch, names = self._watch, self._upstreams
        cut = CounterMetricFamily("gateway_first_token_timeouts", "Streamed attempts cut by "
                                  "the first-token deadline (then retried or failed over).",
                                  labels=["upstream"])
        for name, n in at_zero(names, watch.first_token_timeouts).items():
            cut.add_metric([name], n)
        yield cut
        stalls = CounterMetricFamily("gateway_stream_stalls", "Streams ended as stalled "
                                     "once answering: idle (no event but pings) or slow "
                                     "(under the minimum pace).", labels=["upstream", "reason"])
        known = [(name, reason) for name in names for reason in STALL_REASONS]
        for (name, reason), n in at_zero(known, watch.stalls).items():
            stalls.add_metric([name, reason], n)
        yield stalls
        continued = CounterMetricFamily("gateway_stream_continuations", "Streams of the "
                                        "upstream that broke once answering and were "
                                        "continued on another attempt.", labels=["upstream"])
        for name, n in at_zero(names, watch.continued).items():
            continued.add_metric([name], n)
        yield continued

