"""The verifier the policy names: ``[cache] verifier = "cross" | "mlp"``.

Both shipped verifiers answer ``score(stored_or_new, other, u, v) -> P(same question)``;
the cross-encoder (:mod:`gateway.cache.cross_verifier`, v3) reads the two texts together,
the MLP (:mod:`gateway.cache.mlp_verifier`, v2) looks at their embeddings and word features.
:class:`PolicyVerifier` reads the current policy on every call, so a policy reload switches
verifiers without a restart (the operating point in the same policy is calibrated for the
verifier it names). A verifier whose artifact is missing scores 0.0: no semantic hit, never
a wrong one; exact hits are unaffected.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, Protocol

import numpy as np
import structlog

__all__ = ["PairVerifier", "PolicyVerifier", "VerifierKind"]

log = structlog.get_logger("gateway.cache")

VerifierKind = Literal["cross", "mlp"]


class PairVerifier(Protocol):
    """What the cache asks of a verifier: P(same question) in [0, 1] for texts ``a``, ``b``
    with unit embeddings ``u``, ``v`` [dim]."""

    @property
    def version(self) -> str: ...

    def score(self, a: str, b: str, u: np.ndarray, v: np.ndarray) -> float: ...


def _load(kind: VerifierKind) -> PairVerifier | None:
    try:
        if kind == "cross":
            from gateway.cache.cross_verifier import CrossVerifier

            return CrossVerifier()
        from gateway.cache.mlp_verifier import MlpVerifier

        return MlpVerifier()
    except (FileNotFoundError, ImportError, OSError) as exc:
        log.warning("cache_verifier_unavailable", verifier=kind, error=type(exc).__name__)
        return None


class PolicyVerifier:
    """Scores with the verifier ``kind()`` names now; each is loaded on first use (the
    cross-encoder's session takes ~0.3 s to build, the MLP's arrays ~10 ms)."""

    def __init__(self, kind: Callable[[], VerifierKind],
                 loaded: dict[VerifierKind, PairVerifier | None] | None = None) -> None:
        self.kind = kind
        self._loaded: dict[VerifierKind, PairVerifier | None] = dict(loaded or {})

    def get(self, kind: VerifierKind) -> PairVerifier | None:
        """The verifier of that kind, or None when its artifact is missing."""
        if kind not in self._loaded:
            self._loaded[kind] = _load(kind)
        return self._loaded[kind]

    @property
    def version(self) -> str:
        chosen = self.get(self.kind())
        return chosen.version if chosen is not None else "missing"

    def score(self, a: str, b: str, u: np.ndarray, v: np.ndarray) -> float:
        chosen = self.get(self.kind())
        return 0.0 if chosen is None else chosen.score(a, b, u, v)
