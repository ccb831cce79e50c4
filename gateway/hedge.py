"""A hedged call: the same request sent again, elsewhere, when the first is slow to answer;
the first good answer wins and the other call is cancelled at once.

Dean & Barroso, "The Tail at Scale" (CACM 2013): a hedge sent after the primary has been
outstanding for about its 95th-percentile latency cuts the tail for a few percent more load.
:func:`race` is the race itself, independent of what is raced (dispatch races its attempts
on a model's targets; see :mod:`gateway.balance` for the policy and the budget).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["race"]

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


async def _drop(calls: list[asyncio.Future[R]], discard: Callable[[R], None]) -> None:
    """Cancel the losing calls; a result one made before it could be cancelled is
    discarded (its stream closed, its slot given back)."""
    for call in calls:
        call.cancel()
    for result in await asyncio.gather(*calls, return_exceptions=True):
        if not isinstance(result, BaseException):
            discard(result)
