"""Train the semantic-cache verifier on labeled question pairs (dev split only).

    .venv/bin/python -m gateway.cache.train_verifier [--pairs ../shared/data/semantic_cache/qqp_pairs_dev.jsonl]

Embeds both sides with all-MiniLM-L6-v2 (cached under .cache/embeddings), builds the pair
features of :mod:`gateway.cache.verifier`, fits a one-hidden-layer MLP, and writes
``gateway/cache/verifier.npz``. Also writes the out-of-fold scores (5-fold cross-validation
on the same dev pairs) to ``gateway/cache/verifier_oof.npz``, which ``gateway cache
calibrate`` uses to pick an operating point without touching the test split.
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import numpy as np
import orjson

from gateway.cache.verifier import ARTIFACT, pair_features

__all__ = ["embed_texts", "load_pairs", "main"]

ROOT = Path(__file__).resolve().parents[2]
DEV = ROOT.parent / "shared" / "data" / "semantic_cache" / "qqp_pairs_dev.jsonl"
VERSION = "qqp-dev-mlp64-v1"


def load_pairs(path: Path) -> tuple[list[str], list[str], np.ndarray]:
    """(text_a, text_b, label) columns of a JSONL pairs file."""
    a, b, y = [], [], []
    for line in path.read_bytes().splitlines():
        if line.strip():
            row = orjson.loads(line)
            a.append(str(row["text_a"]))
            b.append(str(row["text_b"]))
            y.append(int(row["label"]))
    return a, b, np.array(y, dtype=np.int64)


def embed_texts(texts: list[str], cache: bool = True) -> np.ndarray:
    """[n, 384] unit vectors, batched; memoised on disk by the texts' hash."""
    digest = hashlib.sha256("\x00".join(texts).encode()).hexdigest()[:24]
    path = ROOT / ".cache" / "embeddings" / f"{digest}.npy"
    if cache and path.exists():
        return np.load(path)
    from local_engine.embedder import Embedder

    embedder = Embedder.load()
    out = np.concatenate([embedder(texts[i:i + 256]) for i in range(0, len(texts), 256)])
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, out)
    return out


def features(a: list[str], b: list[str]) -> np.ndarray:
    ea, eb = embed_texts(a), embed_texts(b)
    return np.stack([pair_features(x, z, u, v) for x, z, u, v in zip(a, b, ea, eb,
                                                                       strict=True)])


def _fit(x: np.ndarray, y: np.ndarray, seed: int = 0):
    from sklearn.neural_network import MLPClassifier
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler().fit(x)
    model = MLPClassifier(hidden_layer_sizes=(64,), alpha=1e-3, batch_size=256,
                          learning_rate_init=1e-3, max_iter=60, early_stopping=True,
                          validation_fraction=0.1, n_iter_no_change=6, random_state=seed)
    model.fit(scaler.transform(x), y)
    return scaler, model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=Path, default=DEV)
    parser.add_argument("--folds", type=int, default=5)
    args = parser.parse_args(argv)
    a, b, y = load_pairs(args.pairs)
    x = features(a, b)
    rng = np.random.default_rng(0)
    fold = rng.integers(0, args.folds, len(y))
    oof = np.zeros(len(y))
    for k in range(args.folds):
        scaler, model = _fit(x[fold != k], y[fold != k])
        oof[fold == k] = model.predict_proba(scaler.transform(x[fold == k]))[:, 1]
    scaler, model = _fit(x, y)
    np.savez(ARTIFACT, mean=scaler.mean_.astype(np.float32),
             scale=scaler.scale_.astype(np.float32),
             w1=model.coefs_[0].astype(np.float32), b1=model.intercepts_[0].astype(np.float32),
             w2=model.coefs_[1].astype(np.float32), b2=model.intercepts_[1].astype(np.float32),
             version=np.array(VERSION))
    np.savez(ARTIFACT.with_name("verifier_oof.npz"), score=oof.astype(np.float32),
             label=y.astype(np.int8))
    order = np.argsort(-oof)
    tp = np.cumsum(y[order])
    precision = tp / np.arange(1, len(y) + 1)
    recall = tp / max(1, y.sum())
    for target in (0.85, 0.9, 0.92, 0.95):
        ok = np.nonzero(precision >= target)[0]
        best = ok[np.argmax(recall[ok])] if len(ok) else None
        if best is not None:
            print(f"out-of-fold: precision >= {target}: recall {recall[best]:.3f} at score "
                  f"{oof[order][best]:.3f}")
    print(f"wrote {ARTIFACT} ({ARTIFACT.stat().st_size} bytes), version {VERSION}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
