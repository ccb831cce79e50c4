"""The embedder the gateway is handed: texts in, unit vectors out.

The cache and the router use whatever the composition root passes in (the app factory
loads all-MiniLM-L6-v2 on a micro-batching thread by default; tests pass small fakes), so
nothing on the request path depends on where embeddings come from.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import numpy as np

__all__ = ["Embed", "LoadEmbedder"]

#: ``await embed(texts)`` -> float32 array of shape [len(texts), dim], rows of unit length.
Embed = Callable[[list[str]], Awaitable[np.ndarray]]

#: Loads the default embedder (slow: a model load); returns it and a function that stops it.
LoadEmbedder = Callable[[], Awaitable[tuple[Embed, Callable[[], None]]]]
