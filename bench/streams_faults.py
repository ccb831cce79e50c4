"""The faults ``bench/streams.py`` injects (pure but for :class:`Faults`, the fakes' ASGI
wrapper): the issue's shares, every time scaled down by ``SCALE``, one seeded draw per
request, applied to its first upstream attempt only.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from typing import Any

__all__ = ["FAULTS", "ITL_MS", "LATE_MS", "READ_TIMEOUT_MS", "SCALE", "STALL_MS", "TOKENS",
           "TTFT_MS", "Faults", "draw", "mid_stream"]

SCALE = 20  # every time below is the real one / SCALE
TTFT_MS, ITL_MS, TOKENS = 50, 10, 24
LATE_MS = 20 * TTFT_MS  # the first token 20x late (1 s: 20 s real)
STALL_MS = 60_000 // SCALE  # 3 s: 60 s real
READ_TIMEOUT_MS = 120_000 // SCALE  # the hosted upstreams' default read timeout, scaled
#: (fault, share of requests), drawn in this order from one uniform number.
FAULTS = (("late", 0.05), ("stall", 0.02), ("cut", 0.02), ("error", 0.01))


def draw(rng: random.Random, tokens: int = TOKENS) -> tuple[str | None, dict[str, str]]:
    """One request's fault and the fake's steering headers for it (``x-fake-bench-*``, which
    :class:`Faults` turns into the fakes' ``x-fake-*`` on the first attempt only)."""
    u, at = rng.random(), 0.0
    for fault, share in FAULTS:
        at += share
        if u < at:
            break
    else:
        return None, {}
    if fault == "late":
        return fault, {"x-fake-bench-first-token-ms": str(LATE_MS - TTFT_MS)}
    if fault == "stall":
        return fault, {"x-fake-bench-stall-after": str(rng.randint(1, tokens - 1)),
                       "x-fake-bench-stall-ms": str(STALL_MS), "x-fake-bench-ping-ms": "250"}
    name = "die-after" if fault == "cut" else "error-midway"
    return fault, {f"x-fake-bench-{name}": str(rng.randint(0, tokens - 1))}


def mid_stream(headers: dict[str, str]) -> bool:
    """Whether the fault comes after content reached the client (a continuation's case)."""
    after = [v for k, v in headers.items() if k.endswith(("stall-after", "die-after", "midway"))]
    return bool(after) and int(after[0]) > 0


class Faults:
    """ASGI wrapper of a fake: ``/<upstream>/...`` is served as ``/...``; a request's
    ``x-fake-bench-*`` headers become the fake's ``x-fake-*`` the first time its
    ``x-fake-bench-id`` is seen, and are dropped on later attempts; calls are counted per
    request id's kind (the id's prefix)."""

    def __init__(self, app: Callable[..., Any]) -> None:
        self.app, self.seen, self.calls = app, set[str](), Counter[str]()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers, rid = [], ""
            for k, v in scope["headers"]:
                if k == b"x-fake-bench-id":
                    rid = v.decode()
            first = rid not in self.seen
            self.seen.add(rid)
            self.calls[rid.split(":")[0]] += 1
            for k, v in scope["headers"]:
                if k.startswith(b"x-fake-bench-"):
                    if first and k != b"x-fake-bench-id":
                        headers.append((b"x-fake-" + k[len(b"x-fake-bench-"):], v))
                else:
                    headers.append((k, v))
            path = scope["path"]
            if not path.startswith("/v1/"):  # /<upstream>/v1/...
                path = "/" + path.split("/", 2)[2]
            scope = {**scope, "headers": headers, "path": path, "raw_path": path.encode()}
        await self.app(scope, receive, send)
