"""Slow and stalled streams for the fake upstreams (:mod:`.fake_upstream`,
:mod:`.fake_anthropic`, :mod:`.fake_responses`), steered by headers:

=========================  =========================================================
``x-fake-first-token-ms``   streaming: the opening events (role chunk, ``message_start``,
                            ``response.created``...) at once, then this long before the
                            first delta (text, tool call or thinking)
``x-fake-stall-after``      streaming: after N deltas, stall: nothing more (but pings)
``x-fake-stall-ms``         the stall lasts this long, then the stream goes on (default:
                            until the client leaves)
``x-fake-ping-ms``          while waiting for the first delta or stalled, a keep-alive every
                            this many ms: Anthropic's ``event: ping``, else an SSE comment
=========================  =========================================================
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

from gateway.types import Send

__all__ = ["ANTHROPIC_PING", "COMMENT_PING", "Stalls"]

ANTHROPIC_PING = b'event: ping\ndata: {"type": "ping"}\n\n'
COMMENT_PING = b": ping\n\n"


@dataclass(frozen=True, slots=True)
class Stalls:
    """One request's steering (all off by default)."""

    first_token_s: float = 0.0
    stall_after: int = -1
    stall_s: float | None = None
    ping_s: float = 0.0

    @classmethod
    def of(cls, headers: Mapping[str, str]) -> Stalls:
        stall_ms = headers.get("x-fake-stall-ms")
        return cls(float(headers.get("x-fake-first-token-ms", 0)) / 1000,
                   int(headers.get("x-fake-stall-after", -1)),
                   None if stall_ms is None else float(stall_ms) / 1000,
                   float(headers.get("x-fake-ping-ms", 0)) / 1000)

    async def before_delta(self, sent: int, send: Send, disconnected: asyncio.Event,
                           ping: bytes) -> bool:
        """Before delta number ``sent`` (0: the first): wait as steered; True when the
        client left meanwhile (the stream is over)."""
        if sent == 0 and self.first_token_s:
            return await self._pause(self.first_token_s, send, disconnected, ping)
        if sent == self.stall_after:
            return await self._pause(self.stall_s, send, disconnected, ping)
        return disconnected.is_set()

    async def _pause(self, seconds: float | None, send: Send, disconnected: asyncio.Event,
                     ping: bytes) -> bool:
        loop = asyncio.get_running_loop()
        end = None if seconds is None else loop.time() + seconds
        while not disconnected.is_set():
            left = None if end is None else end - loop.time()
            if left is not None and left <= 0:
                return False
            step = min(x for x in (left, self.ping_s or None, 3600.0) if x is not None)
            try:
                await asyncio.wait_for(disconnected.wait(), step)
            except TimeoutError:
                if self.ping_s and (end is None or end - loop.time() > 0):
                    await send({"type": "http.response.body", "body": ping, "more_body": True})
        return True
