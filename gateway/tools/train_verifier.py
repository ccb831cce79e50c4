"""Train the semantic-cache verifier on labeled question pairs (dev split only).

    .venv/bin/python -m gateway.tools.train_verifier [--pairs ../shared/data/semantic_cache/qqp_pairs_dev.jsonl]

Embeds both sides with all-MiniLM-L6-v2 (cached under .cache/embeddings), builds the pair
features of :mod:`gateway.cache.mlp_verifier`, fits an ensemble of one-hidden-layer MLPs (torch,
dropout, AdamW; different seeds), and writes ``gateway/cache/verifier.npz``. Also writes the out-of-fold scores (5-fold cross-validation
on the same dev pairs) to ``gateway/cache/verifier_oof.npz``, which ``gateway cache
calibrate`` uses to pick an operating point without touching the test split.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import orjson

from gateway.cache.mlp_verifier import ARTIFACT, pair_features
from gateway.tools.embeddings import embed_texts

__all__ = ["load_pairs", "main"]

ROOT = Path(__file__).resolve().parents[2]
DEV = ROOT.parent / "shared" / "data" / "semantic_cache" / "qqp_pairs_dev.jsonl"
VERSION = "qqp-dev-mlp512x3-v2"


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


def features(a: list[str], b: list[str]) -> np.ndarray:
    ea, eb = embed_texts(a), embed_texts(b)
    return np.stack([pair_features(x, z, u, v) for x, z, u, v in zip(a, b, ea, eb,
                                                                       strict=True)])


def _fit(x: np.ndarray, y: np.ndarray, seed: int, hidden: int = 512, epochs: int = 12
         ) -> dict[str, np.ndarray]:
    """One MLP (dropout on inputs and hidden units, AdamW, one-cycle schedule); returns its
    weights in the artifact's layout."""
    import torch

    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    mean, scale = x.mean(0), x.std(0) + 1e-6
    # Layers are built in the Sequential's order, so the seeded initialisation is unchanged.
    first, last = torch.nn.Linear(x.shape[1], hidden), torch.nn.Linear(hidden, 1)
    net = torch.nn.Sequential(torch.nn.Dropout(0.1), first, torch.nn.ReLU(),
                              torch.nn.Dropout(0.3), last)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=1e-2)
    xt = torch.from_numpy(((x - mean) / scale).astype(np.float32))
    yt = torch.from_numpy(y.astype(np.float32))
    n = len(yt)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, 2e-3, total_steps=epochs * -(-n // 256))
    for _ in range(epochs):
        perm = torch.randperm(n, generator=g)
        for i in range(0, n, 256):
            idx = perm[i:i + 256]
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                net(xt[idx]).squeeze(1), yt[idx])
            opt.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
            opt.step()
            sched.step()
    return {"mean": mean.astype(np.float32), "scale": scale.astype(np.float32),
            "w1": first.weight.detach().numpy().T.copy(), "b1": first.bias.detach().numpy(),
            "w2": last.weight.detach().numpy()[0], "b2": last.bias.detach().numpy()[0]}


def _predict(models: list[dict[str, np.ndarray]], x: np.ndarray) -> np.ndarray:
    out = []
    for m in models:
        h = np.maximum((x - m["mean"]) / m["scale"] @ m["w1"] + m["b1"], 0.0)
        out.append(1.0 / (1.0 + np.exp(-(h @ m["w2"] + m["b2"]))))
    p: np.ndarray = np.mean(out, axis=0)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=Path, default=DEV)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--seeds", type=int, default=3, help="MLPs in the ensemble")
    args = parser.parse_args(argv)
    a, b, y = load_pairs(args.pairs)
    x = features(a, b)
    rng = np.random.default_rng(0)
    fold = rng.integers(0, args.folds, len(y))
    oof = np.zeros(len(y))
    for k in range(args.folds):
        models = [_fit(x[fold != k], y[fold != k], seed) for seed in range(args.seeds)]
        oof[fold == k] = _predict(models, x[fold == k])
    models = [_fit(x, y, seed) for seed in range(args.seeds)]
    np.savez_compressed(
        ARTIFACT,
        mean=np.stack([m["mean"] for m in models]), scale=np.stack([m["scale"] for m in models]),
        w1=np.stack([m["w1"] for m in models]).astype(np.float16),  # weights of standardised x
        b1=np.stack([m["b1"] for m in models]), w2=np.stack([m["w2"] for m in models]),
        b2=np.array([m["b2"] for m in models], dtype=np.float32), version=np.array(VERSION))
    np.savez_compressed(ARTIFACT.with_name("verifier_oof.npz"), score=oof.astype(np.float32),
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
