"""A streaming upstream answer whose first chunk has arrived (gateway.dispatch returns it;
the endpoint's relay reads it and closes it)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from gateway.breaker import Breaker
from gateway.concurrency import Slot
from gateway.errors import UpstreamError
from gateway.tracing import end_stream
from gateway.upstreams.base import RawHeaders, UpstreamResponse

__all__ = ["Opened"]


@dataclass(slots=True)
class Opened:
    """A successful streaming response whose first chunk has been read. The caller closes
    it when the stream is over, saying whether the upstream failed it midway: that releases
    ``slot`` (if any) and reports the stream's outcome to the upstream's ``breaker``."""

    response: UpstreamResponse
    chunks: AsyncIterator[bytes]
    first: bytes
    status: int = 200
    slot: Slot | None = None
    breaker: Breaker | None = None
    span: Any = None  # its attempt's span, when traced (gateway.tracing)

    @property
    def headers(self) -> RawHeaders:
        return self.response.headers

    async def finish(self) -> None:
        """Read what the upstream still sends after the stream's last event (the end of
        its chunked body), so its connection goes back to the pool instead of being
        closed. A failure here harms nobody: the client has everything."""
        if not self.response.at_eof():
            with contextlib.suppress(UpstreamError):
                async for _ in self.chunks:
                    pass

    def close(self, failed: bool = False) -> None:
        """``failed``: the upstream broke the stream (dropped it, stalled, sent an error
        event); a client disconnect is not the upstream's failure."""
        self.response.close()
        if self.slot is not None:
            self.slot.release()
            self.slot = None
        if self.breaker is not None:
            self.breaker.record(not failed)
            self.breaker = None
        if self.span is not None:
            end_stream(self.span, failed)
            self.span = None
