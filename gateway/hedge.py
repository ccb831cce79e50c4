"""A hedged call: the same request sent again, elsewhere, when the first is slow to answer;
the first good answer wins and the other call is cancelled at once.

Dean & Barroso, "The Tail at Scale" (CACM 2013): a hedge sent after the primary has been
outstanding for about its 95th-percentile latency cuts the tail for a few percent more load.
:func:`race` is the race itself, independent of what is raced (dispatch races its attempts
on a model's targets; see :mod:`gateway.balance` for the policy).

:class:`HedgeBudget` bounds the hedges: a token bucket as the retry budget, and none at all
while most recent requests are late. A hedge cuts the tail when few requests are slow; when
most are (the upstream is overloaded, not unlucky), the delay no longer marks the tail, and
hedging would only add load where there is none to spare.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from gateway.retry_budget import RetryBudget, RetryBudgetPolicy

__all__ = ["HedgeBudget", "race"]

R = TypeVar("R")


async def race(primary: Callable[[], Awaitable[R]], hedge: Callable[[], Awaitable[R]],
               after_s: float, allowed: Callable[[], bool], failed: Callable[[R], bool],
               discard: Callable[[R], None]) -> tuple[R, bool]:
    """``primary()``, and ``hedge()`` too when the primary has not finished after
    ``after_s`` and ``allowed()`` says a hedge may be spent. Returns the first result that
    is not ``failed`` (the other call cancelled; a result it had already made is
    ``discard``-ed) and whether a hedge was sent; when both fail, the primary's result, or
    its error when it raised and the hedge did not answer either. Cancelling the caller
    cancels both."""
    first: asyncio.Future[R] = asyncio.ensure_future(primary())
    try:
        done, _ = await asyncio.wait((first,), timeout=after_s)
        if done or not allowed():
            return await first, False
        second: asyncio.Future[R] = asyncio.ensure_future(hedge())
    except BaseException:
        first.cancel()
        raise
    calls = (first, second)
    try:
        pending: set[asyncio.Future[R]] = set(calls)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for call in sorted(done, key=calls.index):  # the primary first on a tie
                if not call.cancelled() and call.exception() is None \
                        and not failed(call.result()):
                    await _drop([c for c in calls if c is not call], discard)
                    return call.result(), True
        for call in calls:  # both failed: a result before an error, the primary first
            if call.exception() is None:
                other = calls[1 - calls.index(call)]
                if other.exception() is None:
                    discard(other.result())
                return call.result(), True
        raise first.exception()  # type: ignore[misc]
    except BaseException:
        await _drop(list(calls), discard)
        raise


class HedgeBudget:
    """``ratio`` hedges per request on average (a token bucket: ``RESERVE`` tokens at most,
    full at start, so a cluster of slow requests is hedged whole: with 2, one slow request
    in ten went unhedged and a short run's p99 could stay in the tail), and none while
    ``late_share`` (an EWMA, weight ``ALPHA``, of requests without an answer after their
    hedge delay) is ``LATE_MAX`` or more: under overload every request is late, so hedging
    stops after a few requests instead of spending the whole ratio (``bench/tail.py``: at
    most 2% extra calls at 3x overload)."""

    ALPHA = 0.1
    LATE_MAX = 0.5
    RESERVE = 5.0

    def __init__(self, ratio: float) -> None:
        self.bucket = RetryBudget(RetryBudgetPolicy(ratio=ratio, max_tokens=self.RESERVE))
        self.late_share = 0.0

    def set_ratio(self, ratio: float) -> None:
        """A new policy's ``hedge_budget``; tokens kept."""
        self.bucket.policy = RetryBudgetPolicy(ratio=ratio, max_tokens=self.RESERVE)

    def deposit(self) -> None:
        """A hedged model's request starts."""
        self.bucket.deposit()

    def allowed(self) -> bool:
        """May a late request be hedged now? Spends a token when yes."""
        return self.late_share < self.LATE_MAX and self.bucket.withdraw()

    def answered(self, late: bool) -> None:
        """A hedged model's request ended: ``late``, its first answer came after its delay."""
        self.late_share += self.ALPHA * (late - self.late_share)


async def _drop(calls: list[asyncio.Future[R]], discard: Callable[[R], None]) -> None:
    """Cancel the losing calls; a result one made before it could be cancelled is
    discarded (its stream closed, its slot given back)."""
    for call in calls:
        call.cancel()
    for result in await asyncio.gather(*calls, return_exceptions=True):
        if not isinstance(result, BaseException):
            discard(result)
