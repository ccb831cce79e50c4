"""The prefix cache's changes, published: each full block hash the block manager stores
or evicts, numbered, so a router can mirror what this engine holds (vLLM's KV events,
``BlockStored``/``BlockRemoved``, which llm-d's precise prefix-cache scorer and NVIDIA
Dynamo's KV router consume; here read by polling ``GET /kv_events?since=N``).

The engine thread appends; the server's event loop reads. Both are single C-level calls on
a deque and a dict (atomic under the GIL), so no lock is taken on the engine's step.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["KvEvents"]


class KvEvents:
    """The last ``size`` events, numbered from 0. ``epoch`` names this engine process: a
    reader that saw another epoch (the engine restarted, its cache empty) starts over."""

    def __init__(self, size: int = 65_536) -> None:
        self.epoch = os.urandom(6).hex()
        self._log: deque[tuple[int, int, int]] = deque(maxlen=size)  # (number, op, hash)
        self._next = 0

    def stored(self, block_hash: int) -> None:
        self._log.append((self._next, 1, block_hash))
        self._next += 1

    def removed(self, block_hash: int) -> None:
        self._log.append((self._next, 0, block_hash))
        self._next += 1

    def since(self, epoch: str, number: int, held: Callable[[], Iterable[int]]
              ) -> dict[str, Any]:
        """What changed from event ``number`` on: ``{"epoch", "next", "events": [[op,
        hash], ...]}`` (op 1: stored, 0: removed, in order); or, when the reader is of
        another epoch or further behind than the log reaches, ``{"epoch", "next",
        "snapshot": [hash, ...]}``: every hash ``held()`` returns now. ``next`` is the
        number to ask from next time."""
        log = list(self._log)  # one atomic copy (the engine thread appends meanwhile)
        end = log[-1][0] + 1 if log else self._next
        first = log[0][0] if log else end
        if epoch != self.epoch or not first <= number <= end:
            snapshot = list(held())
            # events appended while copying are in the snapshot or come again: harmless
            return {"epoch": self.epoch, "next": end, "snapshot": snapshot}
        return {"epoch": self.epoch, "next": end,
                "events": [[op, h] for n, op, h in log[number - first:]]}
