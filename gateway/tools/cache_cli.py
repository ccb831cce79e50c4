"""``gateway cache ...``: calibrate and audit the semantic cache, purge a namespace.

    gateway cache calibrate --pairs FILE --target-precision P
    gateway cache eval --pairs FILE [--policy FILE] [--route MODEL]
    gateway cache purge --namespace NS [--url http://127.0.0.1:8080] [--api-key KEY]

Pairs files are JSONL with ``text_a``, ``text_b``, ``label`` (1 = same question);
``text_a`` plays the stored question, ``text_b`` the new one. ``eval`` decides each pair as
the cache does: the contract veto first; then, with the policy's ``max_error_rate``, the
error bound from a cold start, the pairs in file order, each pair not served teaching it
its label (as a compared answer would); with ``max_error_rate = 0``, the operating point
(cosine and verifier score both past it). ``static_point`` gives the operating point's
figures (with the contract) either way.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

__all__ = ["PairScores", "add_arguments", "operating_point", "precision_recall",
           "precision_recall_curve", "score_pairs", "static_cosine"]

ROOT = Path(__file__).resolve().parents[2]
SIMILARITY_FLOORS = (0.5, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9)


@dataclass
class PairScores:
    a: list[str]
    b: list[str]
    label: np.ndarray  # [n] 0/1
    cosine: np.ndarray  # [n]
    verifier: np.ndarray  # [n] in [0, 1]


def score_pairs(path: Path, use_oof: bool = True) -> PairScores:
    """Embed and score every pair with the shipped verifier. On the verifier's own training
    file, its out-of-fold scores are used instead (so calibration is not in-sample)."""
    from gateway.cache.mlp_verifier import ARTIFACT, MlpVerifier, pair_features
    from gateway.tools.embeddings import embed_texts
    from gateway.tools.train_verifier import load_pairs

    a, b, y = load_pairs(path)
    ea, eb = embed_texts(a), embed_texts(b)
    cosine = np.einsum("ij,ij->i", ea, eb)
    oof_path = ARTIFACT.with_name("verifier_oof.npz")
    if use_oof and oof_path.exists():
        oof = np.load(oof_path)
        if len(oof["label"]) == len(y) and np.array_equal(oof["label"], y):
            return PairScores(a, b, y, cosine, oof["score"].astype(np.float64))
    verifier = MlpVerifier()
    x = np.stack([pair_features(p, q, u, v) for p, q, u, v in zip(a, b, ea, eb, strict=True)])
    return PairScores(a, b, y, cosine, verifier.score_features(x))


def precision_recall(hit: np.ndarray, label: np.ndarray) -> tuple[float, float]:
    """(precision, recall) of boolean decisions ``hit`` [n] against 0/1 ``label`` [n];
    precision is 1.0 when nothing is a hit."""
    tp = int((hit & (label == 1)).sum())
    precision = tp / int(hit.sum()) if hit.any() else 1.0
    return precision, tp / max(1, int(label.sum()))


def precision_recall_curve(s: PairScores, floor: float, steps: int = 41) -> list[dict[str, float]]:
    """Precision and recall as the verifier threshold moves, at one similarity floor."""
    out = []
    for t in np.linspace(0.0, 1.0, steps):
        p, r = precision_recall((s.cosine >= floor) & (s.verifier >= t), s.label)
        out.append({"verifier": round(float(t), 3), "precision": round(p, 4),
                    "recall": round(r, 4)})
    return out


def operating_point(s: PairScores, target: float) -> dict[str, float] | None:
    """The (similarity floor, verifier threshold) with the most recall at precision >=
    ``target``, or None when no point reaches it."""
    best: dict[str, float] | None = None
    for floor in SIMILARITY_FLOORS:
        for t in np.linspace(0.0, 1.0, 201):
            p, r = precision_recall((s.cosine >= floor) & (s.verifier >= t), s.label)
            if p >= target and (best is None or r > best["recall"]):
                best = {"similarity": floor, "verifier": round(float(t), 3),
                        "precision": round(p, 4), "recall": round(r, 4)}
    return best


def static_cosine(s: PairScores, target: float) -> dict[str, float] | None:
    """The baseline: cosine threshold alone, best recall at precision >= ``target``."""
    best = None
    for t in np.linspace(0.5, 1.0, 501):
        p, r = precision_recall(s.cosine >= t, s.label)
        if p >= target and (best is None or r > best["recall"]):
            best = {"similarity": round(float(t), 3), "precision": round(p, 4),
                    "recall": round(r, 4)}
    return best


def _calibrate(args: argparse.Namespace) -> int:
    s = score_pairs(Path(args.pairs))
    point = operating_point(s, args.target_precision)
    floor = point["similarity"] if point else 0.7
    print(orjson.dumps({
        "pairs": len(s.label), "positives": int(s.label.sum()),
        "target_precision": args.target_precision, "operating_point": point,
        "static_cosine_baseline": static_cosine(s, args.target_precision),
        "curve_at_similarity_floor": floor, "curve": precision_recall_curve(s, floor),
    }, option=orjson.OPT_INDENT_2).decode())
    if point is None:
        print("no operating point reaches the target precision", file=sys.stderr)
        return 1
    print(f"policy: [cache] operating_point = {{ similarity = {point['similarity']}, "
          f"verifier = {point['verifier']} }}", file=sys.stderr)
    return 0


def _shipped_point(policy_path: str, route: str | None) -> Any:
    from gateway.policy import load_policy

    policy = load_policy(Path(policy_path))
    return policy.cache.point(route) if route else policy.cache.operating_point


def _eval(args: argparse.Namespace) -> int:
    from gateway.cache.bound import ErrorBound
    from gateway.cache.contract import terms, veto
    from gateway.policy import load_policy

    cache = load_policy(Path(args.policy)).cache
    point = cache.point(args.route) if args.route else cache.operating_point
    s = score_pairs(Path(args.pairs), use_oof=False)
    kept = np.array([veto(terms(b), terms(a)) is None for a, b in zip(s.a, s.b, strict=True)])
    static = kept & (s.cosine >= point.similarity) & (s.verifier >= point.verifier)
    hit = static
    if cache.max_error_rate > 0:  # as the gateway serves them: a cold bound, learning
        bound = ErrorBound(cache.max_error_rate, cache.explore_share)
        hit = np.zeros(len(s.label), bool)
        for i in np.nonzero(kept & (s.cosine >= point.similarity))[0]:
            c, v = float(s.cosine[i]), float(s.verifier[i])
            hit[i] = bound.decide("eval", f"pair-{i}", c, v) == "serve"
            if not hit[i]:
                bound.learn("eval", f"pair-{i}", c, v, bool(s.label[i]))
    precision, recall = precision_recall(hit, s.label)
    out: dict[str, Any] = {
        "pairs": len(s.label), "max_error_rate": cache.max_error_rate,
        "operating_point": {"similarity": point.similarity, "verifier": point.verifier},
        "contract_refused": int((~kept).sum()),
        "precision": round(precision, 4), "recall": round(recall, 4),
        "hits": int(hit.sum()), "wrong_hits": int((hit & (s.label == 0)).sum()),
        "static_point": dict(zip(("precision", "recall"), (round(x, 4) for x in
                                                             precision_recall(static, s.label)),
                                 strict=True)),
    }
    if not args.summary:
        out["decisions"] = [{"similarity": round(float(c), 4), "verifier": round(float(v), 4),
                             "contract": bool(k), "hit": bool(h), "label": int(lab)}
                            for c, v, k, h, lab in zip(s.cosine, s.verifier, kept, hit,
                                                       s.label, strict=True)]
    print(orjson.dumps(out).decode())
    return 0


def _purge(args: argparse.Namespace) -> int:
    import httpx

    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    r = httpx.post(args.url.rstrip("/") + "/admin/cache/purge",
                   json={"namespace": args.namespace}, headers=headers)
    print(r.text)
    return 0 if r.status_code == 200 else 1


def _train(args: argparse.Namespace) -> int:
    from gateway.tools.train_verifier import main

    return main(["--pairs", args.pairs] if args.pairs else [])


def add_arguments(cache: argparse.ArgumentParser) -> None:
    """Fill the ``gateway cache`` parser: its calibrate, eval, purge and train actions."""
    actions = cache.add_subparsers(dest="cache_command", required=True)
    cal = actions.add_parser("calibrate", help="precision/recall curve and the operating "
                             "point that meets a target precision")
    cal.add_argument("--pairs", required=True)
    cal.add_argument("--target-precision", type=float, default=0.9)
    cal.set_defaults(func=_calibrate)
    ev = actions.add_parser("eval", help="precision, recall and each pair's decision as the "
                            "shipped policy's cache decides them, as JSON")
    ev.add_argument("--pairs", required=True)
    ev.add_argument("--policy", default=str(ROOT / "policies" / "default.toml"))
    ev.add_argument("--route", help="public model name whose operating point to use")
    ev.add_argument("--summary", action="store_true", help="omit per-pair decisions")
    ev.set_defaults(func=_eval)
    pu = actions.add_parser("purge", help="drop a namespace's entries from a running gateway")
    pu.add_argument("--namespace", required=True)
    pu.add_argument("--url", default="http://127.0.0.1:8080")
    pu.add_argument("--api-key")
    pu.set_defaults(func=_purge)
    tr = actions.add_parser("train", help="retrain the verifier (dev pairs only)")
    tr.add_argument("--pairs")
    tr.set_defaults(func=_train)
