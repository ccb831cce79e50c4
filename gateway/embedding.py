"""The embedder the gateway is handed: texts in, unit vectors out; and one request's memo of
them.

The cache and the router use whatever the composition root passes in (the app factory
loads all-MiniLM-L6-v2 on a micro-batching thread by default; tests pass small fakes), so
nothing on the request path depends on where embeddings come from.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import numpy as np

__all__ = ["Embed", "EmbeddingMemo", "LoadEmbedder"]

#: ``await embed(texts)`` -> float32 array of shape [len(texts), dim], rows of unit length.
Embed = Callable[[list[str]], Awaitable[np.ndarray]]

#: Loads the default embedder (slow: a model load); returns it and a function that stops it.
LoadEmbedder = Callable[[], Awaitable[tuple[Embed, Callable[[], None]]]]


class EmbeddingMemo:
    """One request's embeddings by text, each computed at most once, even when two stages
    ask for the same text at the same time (the cache's semantic lookup runs alongside the
    rest of the pipeline, so the route stage may ask while the cache's embedding is still
    on its way: it waits for that one instead of computing its own)."""

    __slots__ = ("_pending", "_vectors")

    def __init__(self) -> None:
        self._vectors: dict[str, np.ndarray] = {}
        self._pending: dict[str, asyncio.Future[np.ndarray | None]] | None = None

    def get(self, text: str) -> np.ndarray | None:
        """The text's embedding if it is known now."""
        return self._vectors.get(text)

    def __setitem__(self, text: str, vector: np.ndarray) -> None:
        self._vectors[text] = vector

    async def compute(self, text: str,
                      embed: Callable[[str], Awaitable[np.ndarray | None]]) -> np.ndarray | None:
        """The text's embedding: known, being computed (awaited, shared), or computed now by
        ``embed`` (which returns None when it cannot: then so does every caller waiting for
        it, and the next caller tries again). A waiter that is cancelled leaves the
        computation running for the others."""
        vector = self._vectors.get(text)
        if vector is not None:
            return vector
        pending = self._pending if self._pending is not None else {}
        running = pending.get(text)
        if running is not None:
            return await asyncio.shield(running)
        self._pending = pending
        future: asyncio.Future[np.ndarray | None] = asyncio.get_running_loop().create_future()
        pending[text] = future
        computed: np.ndarray | None = None
        try:
            computed = await embed(text)
        finally:
            del pending[text]
            future.set_result(computed)  # None when embed raised or was cancelled
        vector = computed
        if vector is not None:
            self._vectors[text] = vector
        return vector
