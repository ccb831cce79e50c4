"""Send a request to a model's targets in order, with retries, before any byte reaches the client.

For each target (the model's ordered fallback list), up to ``max_attempts`` attempts. An
attempt is retried on :class:`~gateway.errors.UpstreamUnreachable` or a broken-off response,
and on the policy's ``retry_on_status`` (429 and 5xx). The wait before attempt n+1 is the
upstream's ``Retry-After``/``retry-after-ms`` when given (a longer one than
``max_retry_after_ms`` moves on to the next target at once), else exponential backoff with
full jitter (AWS Architecture Blog, "Exponential Backoff And Jitter", 2015). A read timeout is
not retried: the upstream may still be working on it. When every attempt fails with a status,
the last upstream response is returned as it is, so the client sees the upstream's own error.

A streaming attempt includes the first body chunk: an upstream that accepts and then dies
before sending anything is retried too. After that, the caller owns the stream.
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from gateway.config import Target
from gateway.errors import NoUpstreamAvailable, UpstreamError, UpstreamTimeout
from gateway.policy import RetryPolicy
from gateway.requestlog import RequestRecord
from gateway.upstreams.base import RawHeaders, Reply, Upstream, UpstreamRequest, UpstreamResponse

__all__ = ["Dispatcher", "Opened", "backoff_ms", "retry_after_ms"]

R = TypeVar("R", Reply, "Opened")


@dataclass(slots=True)
class Opened:
    """A successful streaming response whose first chunk has been read."""

    response: UpstreamResponse
    chunks: AsyncIterator[bytes]
    first: bytes
    status: int = 200


def backoff_ms(attempt: int, policy: RetryPolicy, rand: Callable[[], float]) -> float:
    """Full-jitter delay before retry ``attempt`` (1-based), in ms."""
    cap = min(policy.max_delay_ms, policy.base_delay_ms * 2 ** (attempt - 1))
    return rand() * cap


def retry_after_ms(headers: RawHeaders) -> float | None:
    """``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date), in ms; None if absent."""
    seconds: str | None = None
    for k, v in headers:
        k = k.lower()
        if k == b"retry-after-ms":
            try:
                return max(0.0, float(v))
            except ValueError:
                continue
        if k == b"retry-after":
            seconds = v.decode("latin-1").strip()
    if seconds is None:
        return None
    try:
        return max(0.0, float(seconds) * 1000)
    except ValueError:
        when = email.utils.parsedate_to_datetime(seconds) if seconds else None
        return None if when is None else max(0.0, (when.timestamp() - time.time()) * 1000)


class Dispatcher:
    def __init__(
        self,
        upstreams: dict[str, Upstream],
        *,
        rand: Callable[[], float] = random.random,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ):
        self.upstreams = upstreams
        self._rand = rand
        self._sleep = sleep

    async def unary(
        self,
        targets: Sequence[Target],
        build: Callable[[Target], UpstreamRequest],
        policy: RetryPolicy,
        rec: RequestRecord,
    ) -> tuple[Target, Reply]:
        async def attempt(upstream: Upstream, target: Target) -> Reply:
            return await upstream.send(build(target))

        return await self._run(targets, attempt, policy, rec)

    async def stream(
        self,
        targets: Sequence[Target],
        build: Callable[[Target], UpstreamRequest],
        policy: RetryPolicy,
        rec: RequestRecord,
    ) -> tuple[Target, Reply | Opened]:
        async def attempt(upstream: Upstream, target: Target) -> Reply | Opened:
            response = await upstream.stream(build(target))
            try:
                if response.status != 200:
                    return Reply(response.status, response.headers, await response.read())
                chunks = response.iter_chunks()
                first = await anext(chunks, b"")
            except BaseException:
                response.close()
                raise
            return Opened(response, chunks, first)

        return await self._run(targets, attempt, policy, rec)

    async def _run(
        self,
        targets: Sequence[Target],
        attempt: Callable[[Upstream, Target], Awaitable[R]],
        policy: RetryPolicy,
        rec: RequestRecord,
    ) -> tuple[Target, R]:
        last: tuple[Target, R] | None = None
        error: UpstreamError | None = None
        tries = 0
        for target in targets:
            upstream = self.upstreams[target.upstream]
            if not upstream.enabled:
                continue
            if rec.upstream_started is None:
                rec.upstream_started = time.perf_counter()
            rec.upstream, rec.model_served = target.upstream, target.model
            for n in range(1, policy.max_attempts + 1):
                if tries:
                    rec.retries += 1
                tries += 1
                try:
                    result = await attempt(upstream, target)
                except UpstreamTimeout:
                    raise
                except UpstreamError as exc:
                    error, last = exc, None
                    delay = backoff_ms(n, policy, self._rand)
                else:
                    if result.status not in policy.retry_on_status:
                        return target, result
                    error, last = None, (target, result)
                    hinted = retry_after_ms(result.headers)
                    if hinted is not None and hinted > policy.max_retry_after_ms:
                        break
                    delay = hinted if hinted is not None else backoff_ms(n, policy, self._rand)
                if n < policy.max_attempts:
                    await self._sleep(delay / 1000)
        if last is not None:
            return last
        if error is not None:
            raise error
        raise NoUpstreamAvailable(
            "no upstream is available for this model (are the upstreams' API keys set?)"
        )
