"""Embeddings for offline work (training, calibration, benchmarks), memoised on disk.

The request path embeds through the engine's micro-batching thread
(:class:`local_engine.async_engine.AsyncEngine`); scripts embed thousands of texts at once
with :func:`embed_texts`, which runs the same :class:`~local_engine.embedder.Embedder` and
keeps the result under ``.cache/embeddings`` keyed by the texts' hash.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

__all__ = ["embed_texts"]

ROOT = Path(__file__).resolve().parents[2]


def embed_texts(texts: list[str], cache: bool = True) -> np.ndarray:
    """[n, 384] unit vectors (all-MiniLM-L6-v2), batched; memoised on disk by the texts' hash."""
    digest = hashlib.sha256("\x00".join(texts).encode()).hexdigest()[:24]
    path = ROOT / ".cache" / "embeddings" / f"{digest}.npy"
    if cache and path.exists():
        memo: np.ndarray = np.load(path)
        return memo
    from local_engine.embedder import Embedder

    embedder = Embedder.load()
    out = np.concatenate([embedder(texts[i:i + 256]) for i in range(0, len(texts), 256)])
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, out)
    return out
