"""Stage ``rate_limit``: requests and tokens per minute per gateway key (and per key and
model), held jointly by every replica that shares the gateway's Redis.

Each request is charged, all or nothing, to up to four GCRA buckets (requests and tokens;
the key's, and the key's for this model when the policy's ``[rate_limits]`` gives the model
a limit of its own) in one Redis round trip (:mod:`gateway.ratelimit`). Over a limit: 429
in the caller's format (OpenAI: ``type`` ``requests`` or ``tokens``, ``code``
``rate_limit_exceeded``; Anthropic: ``rate_limit_error``) with ``Retry-After`` (s) and
``retry-after-ms``, before anything else runs. Every answer, refused or not, carries the
limits as OpenAI sends them (https://platform.openai.com/docs/guides/rate-limits):
``x-ratelimit-limit-requests``, ``x-ratelimit-remaining-requests``,
``x-ratelimit-reset-requests`` (a duration: ``20ms``, ``1.5s``, ``6m0s``: until the bucket
is full again), and the same for ``tokens``; of a key's and a model's bucket, the one with
less left. Redis down or slow: this process decides alone, under the same limits (see
:mod:`gateway.ratelimit.limiter`); no request fails for it.

Tokens are reserved up front and settled after the answer. The reservation is the prompt
estimated as the body's bytes / 4 plus ``max_tokens`` (``max_completion_tokens``; times
``n``; else the policy's ``default_completion_tokens``), as OpenAI counts ``max_tokens``
against TPM when a request arrives: concurrent requests cannot overrun a limit that only
learns their cost after they finish, and a reservation larger than the whole limit waits
for a full bucket instead of being refused forever. Once the reply is over, the bucket is
settled to the actual usage (prompt plus completion tokens, in the background): unused
``max_tokens`` comes back, usage beyond the reservation is owed. A request no upstream
served (a cache hit) gives its tokens back; an error answer too; an answer without usage
keeps its reservation. The request itself always counts.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gateway.context import Headers, Next, Outcome, Reply, RequestContext
from gateway.errors import RateLimited
from gateway.models import model_key
from gateway.ratelimit.gcra import Bucket, Verdict
from gateway.ratelimit.limiter import RateLimiter
from gateway.ratelimit.policy import KeyLimits, Limits, RateLimitPolicy

if TYPE_CHECKING:
    from gateway.policy import Policy
    from gateway.requestlog import RequestRecord

__all__ = ["RateLimitStage", "build", "charge_request", "duration",
           "reservation", "rfc3339_after"]

#: Per kind, its ``x-ratelimit-*`` header names and its ``anthropic-ratelimit-*`` ones
#: (limit, remaining, reset).
_HEADERS = tuple(
    (kind, tuple(f"x-ratelimit-{part}-{kind}".encode() for part in ("limit", "remaining",
                                                                    "reset")),
     tuple(f"anthropic-ratelimit-{kind}-{part}".encode() for part in ("limit", "remaining",
                                                                      "reset")))
    for kind in ("requests", "tokens"))
_NAMES = {"requests": "requests per min (RPM)", "tokens": "tokens per min (TPM)"}


def build(policy: RateLimitPolicy, limiter: RateLimiter) -> RateLimitStage | None:
    """None when the policy sets no limit (or ``enabled = false``)."""
    if not policy.active:
        return None
    return RateLimitStage(policy, limiter)


def duration(seconds: float) -> str:
    """A duration as OpenAI's ``x-ratelimit-reset-*`` headers write it (Go's format):
    ``0s``, ``20ms``, ``1.5s``, ``6m0s``, ``1h0m0s``; rounded up to the millisecond."""
    ms = max(0, math.ceil(seconds * 1000 - 1e-6))
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    minutes, ms = divmod(ms, 60_000)
    hours, minutes = divmod(minutes, 60)
    secs = f"{ms // 1000}.{ms % 1000:03d}".rstrip("0").rstrip(".")
    return (f"{hours}h" if hours else "") + (f"{minutes}m" if hours or minutes else "") \
        + f"{secs}s"


def rfc3339_after(seconds: float) -> str:
    """UTC time ``seconds`` from now, to the second (rounded up), as ``2026-11-24T20:31:05Z``."""
    # As datetime.now(UTC) + timedelta(seconds=ceil(...)) formatted, at a tenth of the cost:
    # the clock's whole seconds (floored, as datetime's) plus the rounded-up wait, each
    # second formatted once.
    return _utc_second(time.time_ns() // 1_000_000_000 + math.ceil(max(0.0, seconds)))


def _reset(seconds: float) -> bytes:
    """:func:`duration` encoded (its sub-second case written here, the common one)."""
    ms = math.ceil(seconds * 1000 - 1e-6)
    if 0 < ms < 1000:
        return b"%dms" % ms
    return duration(seconds).encode()


@functools.lru_cache(maxsize=4)
def _utc_second(second: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second))


def reservation(body: dict[str, Any], raw: bytes, default_completion: int) -> int:
    """Tokens reserved for a request: its body's bytes / 4 (the prompt, generously: the
    JSON around it counts too) plus its completion budget times ``n``."""
    out = body.get("max_completion_tokens")
    if not isinstance(out, int):
        out = body.get("max_tokens")
    if not isinstance(out, int) or out < 0:
        out = default_completion
    n = body.get("n")
    return len(raw) // 4 + out * (n if isinstance(n, int) and n > 1 else 1)


class _Plan:
    """One request's buckets, and what each one is (kind, scope, limit) for the headers,
    the 429 message and the settlement. The stage makes one per key and model, once per
    policy snapshot, and a copy of it per request with the token costs set
    (:meth:`with_tokens`): only the buckets differ, the rest is shared and never changed."""

    __slots__ = ("_heads", "buckets", "kinds", "scopes", "token_at")

    def __init__(self) -> None:
        self.buckets: list[Bucket] = []
        self.kinds: list[str] = []
        self.scopes: list[str] = []
        self.token_at: list[int] = []  # the token buckets' places in ``buckets``
        #: Per kind that has buckets: its header names and its buckets' places.
        self._heads: list[tuple[tuple[bytes, ...], tuple[bytes, ...], list[int]]] | None = None

    def add(self, name: str, scope: str, limits: Limits | KeyLimits, tokens: int) -> None:
        """The buckets of ``limits`` (requests, then tokens: those it limits)."""
        # A cost over the whole limit waits for a full bucket, then owes the rest.
        limit = limits.requests_per_minute
        if limit:
            self.buckets.append(Bucket(name + ":r", limit, 1))
            self.kinds.append("requests")
            self.scopes.append(scope)
        limit = limits.tokens_per_minute
        if limit:
            self.token_at.append(len(self.buckets))
            self.buckets.append(Bucket(name + ":t", limit, min(limit, tokens)))
            self.kinds.append("tokens")
            self.scopes.append(scope)
        self._heads = None

    def with_tokens(self, tokens: int) -> _Plan:
        """This plan for a request reserving ``tokens``: its token buckets' costs set."""
        plan = _Plan.__new__(_Plan)
        plan.kinds, plan.scopes, plan.token_at = self.kinds, self.scopes, self.token_at
        plan._heads = self._heads_by_kind()
        plan.buckets = buckets = self.buckets.copy()
        for i in self.token_at:
            b = buckets[i]
            buckets[i] = Bucket(b.key, b.limit, min(b.limit, tokens))
        return plan

    def headers(self, verdict: Verdict, anthropic: bool = False) -> Headers:
        """The ``x-ratelimit-*`` headers: per kind, the bucket with the least left; for an
        Anthropic client also ``anthropic-ratelimit-{requests,tokens}-{limit,remaining,
        reset}``, the reset an RFC 3339 time, as Anthropic sends them
        (https://docs.anthropic.com/en/api/rate-limits)."""
        out: Headers = []
        remaining, reset_s = verdict.remaining, verdict.reset_s
        for names, anthropic_names, at in self._heads_by_kind():
            i = at[0]  # of this kind, the first with the least left, then the longest reset
            for j in at[1:]:
                if (remaining[j], -reset_s[j]) < (remaining[i], -reset_s[i]):
                    i = j
            limit, left = b"%d" % self.buckets[i].limit, b"%d" % remaining[i]
            out += ((names[0], limit), (names[1], left), (names[2], _reset(reset_s[i])))
            if anthropic:
                out += ((anthropic_names[0], limit), (anthropic_names[1], left),
                        (anthropic_names[2], rfc3339_after(reset_s[i]).encode()))
        return out

    def _heads_by_kind(self) -> list[tuple[tuple[bytes, ...], tuple[bytes, ...], list[int]]]:
        heads = self._heads
        if heads is None:
            heads = self._heads = [
                (names, anthropic_names, at) for kind, names, anthropic_names in _HEADERS
                if (at := [j for j, k in enumerate(self.kinds) if k == kind])]
        return heads

    def refusal(self, verdict: Verdict, tokens: int) -> RateLimited:
        """The 429 for the bucket that keeps the request waiting longest."""
        i = max(range(len(self.buckets)), key=lambda j: verdict.wait_s[j])
        kind, bucket, wait = self.kinds[i], self.buckets[i], verdict.wait_s[i]
        requested = 1 if kind == "requests" else tokens
        return RateLimited(
            f"Rate limit reached for {self.scopes[i]} on {_NAMES[kind]}: Limit "
            f"{bucket.limit}, Remaining {verdict.remaining[i]}, Requested {requested}. "
            f"Please try again in {duration(wait)}.", kind=kind, retry_after_s=wait)

    def settlement(self, used: int) -> list[Bucket]:
        """The token buckets' corrections to ``used`` tokens (none where nothing changes)."""
        buckets = self.buckets
        return [Bucket(b.key, b.limit, used - b.cost) for i in self.token_at
                if used != (b := buckets[i]).cost]


def _key_bucket(key: str | None) -> tuple[str, str]:
    """A key's bucket name prefix (in braces: a Redis Cluster hash tag, so a key's buckets
    share a slot) and how a 429 names it."""
    name = "{" + (key if key is not None else "-") + "}"
    return name, f"key '{key}'" if key is not None else "requests without a key"


async def charge_request(limiter: RateLimiter, policy: Policy, key_id: str | None,
                         rec: RequestRecord, *, tokens: int | None = None,
                         anthropic: bool = False) -> tuple[Headers, RateLimited | None]:
    """A request outside the model endpoints, charged to its key's buckets, the ones the
    stage charges model requests to: one request, and with ``tokens`` (a pass-through
    request's body bytes / 4, as a model request's prompt is estimated) that many tokens,
    all or nothing, never settled (no usage comes back); without (``count_tokens``, which
    generates nothing), requests only. Returns the ``x-ratelimit-*`` headers
    (``anthropic``: Anthropic's ``anthropic-ratelimit-*`` too, as the stage sends an
    Anthropic client) and the 429 to answer with, if any; nothing when the pipeline has no
    ``rate_limit`` stage or no limit applies."""
    limits = policy.rate_limits
    if not limits.active or "rate_limit" not in policy.pipeline.stages:
        return [], None
    plan = _Plan()
    name, scope = _key_bucket(key_id)
    own = limits.for_key(key_id)
    plan.add(name, scope, own if tokens is not None else Limits(own.requests_per_minute, 0),
             tokens or 0)
    if not plan.buckets:
        return [], None
    _, headers, refusal = await _charge(limiter, limits, plan, tokens or 0, rec, anthropic)
    return headers, refusal


async def _charge(limiter: RateLimiter, policy: RateLimitPolicy, plan: _Plan, tokens: int,
                  rec: RequestRecord, anthropic: bool = False
                  ) -> tuple[Verdict, Headers, RateLimited | None]:
    """Charge ``plan``'s buckets (all or none), note it in ``rec``; the verdict, the
    headers that say it, and the 429 when refused."""
    return _noted(plan, await limiter.check(plan.buckets, policy), tokens, rec, anthropic)


def _noted(plan: _Plan, verdict: Verdict, tokens: int, rec: RequestRecord, anthropic: bool
           ) -> tuple[Verdict, Headers, RateLimited | None]:
    rec.rate_limit = verdict.store
    refusal = None
    if not verdict.allowed:
        refusal = plan.refusal(verdict, tokens)
        rec.rate_limited = refusal.type
    return verdict, plan.headers(verdict, anthropic), refusal


class RateLimitStage:
    def __init__(self, policy: RateLimitPolicy, limiter: RateLimiter) -> None:
        self.policy = policy
        self.limiter = limiter
        #: (key id, model) -> its plan with no tokens (made on first use; the stage lives as
        #: long as its policy snapshot, and models are the configured ones: an id a pattern
        #: resolved is its pattern unless the limits name it, gateway.models.model_key).
        self._plans: dict[tuple[str | None, str], _Plan] = {}

    def plan(self, ctx: RequestContext) -> tuple[_Plan, int]:
        """The request's buckets (none when no limit applies) and its token reservation."""
        tokens = reservation(ctx.body, ctx.raw, self.policy.default_completion_tokens)
        model, route = ctx.model, ctx.route
        if route is not None and route.pattern is not None:
            model = model_key(model, route, self.policy.for_key(ctx.key_id).models)
        shape = self._plans.get((ctx.key_id, model))
        if shape is None:
            shape = self._plans[ctx.key_id, model] = self._shape(ctx.key_id, model)
        return shape.with_tokens(tokens), tokens

    def _shape(self, key_id: str | None, model: str) -> _Plan:
        limits = self.policy.for_key(key_id)
        plan = _Plan()
        name, scope = _key_bucket(key_id)
        plan.add(name, scope, limits, 0)
        own = limits.models.get(model)
        if own is not None:
            plan.add(f"{name}:m:{model}", f"{scope} and model '{model}'", own, 0)
        return plan

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        plan, tokens = self.plan(ctx)
        if not plan.buckets:
            return await call_next(ctx)
        # Decided here when no Redis round trip is needed: no coroutine for it.
        anthropic = ctx.api.name == "anthropic"
        verdict = self.limiter.check_here(plan.buckets)
        if verdict is None:
            verdict, headers, refusal = await _charge(self.limiter, self.policy, plan, tokens,
                                                      ctx.record, anthropic)
        else:
            verdict, headers, refusal = _noted(plan, verdict, tokens, ctx.record, anthropic)
        ctx.response_headers += headers
        if refusal is not None:
            raise refusal
        try:
            reply = await call_next(ctx)
        except BaseException:
            self._settle(plan, verdict, 0)  # no answer: no tokens spent
            raise
        reply.on_close(self._closer(ctx, reply, plan, verdict))
        return reply

    def _closer(self, ctx: RequestContext, reply: Reply, plan: _Plan,
                verdict: Verdict) -> Callable[[Outcome], None]:
        def settle(outcome: Outcome) -> None:
            if ctx.upstream is None:  # nothing reached an upstream (a cache hit)
                used: int | None = 0
            else:
                used = ctx.usage.spent if ctx.usage is not None else None
                if used is None:  # spent, but how much is unknown: the reservation stands
                    used = None if reply.status == 200 else 0
            if used is not None:
                self._settle(plan, verdict, used)
        return settle

    def _settle(self, plan: _Plan, verdict: Verdict, used: int) -> None:
        buckets: Sequence[Bucket] = plan.settlement(used)
        if buckets:
            self.limiter.settle(buckets, verdict.store, self.policy)
