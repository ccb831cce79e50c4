"""Calibrate the error bound's prior (``gateway/cache/bound_prior.json``) on QQP dev.

    python -m gateway.tools.calibrate_bound

``PAIRS`` ``qqp_pairs_dev`` pairs (seeded) that the contract veto passes: their cosine
similarity (all-MiniLM-L6-v2), the MLP verifier's out-of-fold score (``verifier_oof.npz``,
written by ``train_verifier``: no pair is scored by a model that saw it) and whether the two
questions differ (label 0), counted per cell by :func:`gateway.cache.bound.calibrate`. Dev
only; nothing is fitted to a test split. Embedding takes about two minutes on 2 cores.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gateway.cache.bound import PRIOR, calibrate
from gateway.cache.contract import terms, veto
from gateway.cache.mlp_verifier import ARTIFACT
from gateway.tools.embeddings import embed_texts
from gateway.tools.train_verifier import load_pairs

PAIRS = 8000

DEV = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "semantic_cache" / \
    "qqp_pairs_dev.jsonl"


def main() -> None:
    a, b, y = load_pairs(DEV)
    oof = np.load(ARTIFACT.with_name("verifier_oof.npz"))
    assert (oof["label"] == y).all(), "verifier_oof.npz is not for this file's order"
    sample = np.sort(np.random.default_rng(0).choice(len(y), PAIRS, replace=False))
    cos = np.einsum("ij,ij->i", embed_texts([a[i] for i in sample]),
                    embed_texts([b[i] for i in sample]))
    keep = [n for n, i in enumerate(sample) if veto(terms(a[i]), terms(b[i])) is None]
    prior = calibrate(cos[keep].tolist(), oof["score"][sample[keep]].tolist(),
                      (y[sample[keep]] == 0).tolist())
    prior.dump(PRIOR, f"qqp_pairs_dev: {len(keep)} of {PAIRS} sampled pairs pass the contract "
                      "veto; cosine (all-MiniLM-L6-v2) and MLP verifier out-of-fold scores")
    print(f"{PRIOR}: {len(keep)} pairs")


if __name__ == "__main__":
    main()
