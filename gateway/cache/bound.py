"""Semantic hits under an error bound: serve a neighbour's answer only while the estimated
chance that it is wrong stays within ``max_error_rate`` (delta), learning online.

A single global threshold cannot be right: where a pair's scores must reach before two
questions share an answer differs from one population of questions to another (on QQP the
embedding's cosine barely separates duplicates and the verifier does; on GPTCache's
paraphrases it is the other way round). vCache (Schroeder et al., "vCache: Verified Semantic
Prompt Caching", arXiv 2502.03771) learns thresholds online and bounds the served error by a
user-set delta; this module does so per group (a namespace's public model: each tenant's
questions are a population of their own, and one tenant's outcomes, right or wrong, must
never open or close matching for another) with a count-based rule:

- **Outcomes**: whenever a request with a candidate goes upstream, its fresh answer is
  compared with the candidate's (the caller does it): (cosine, verifier score, right or
  wrong), counted in a grid of cosine bins (``COS_BIN`` wide) by verifier levels
  (``LEVELS``). Counts fade (``FORGET``), so the bound follows drifting traffic.
- **Served region**: a quadrant, cosine >= t and verifier >= a level. For each level, t
  comes down from the top in a fixed sequence of tests (Angelopoulos et al. 2021, "Learn
  then Test"): once the pairs in the quadrant number at least ``MIN_PAIRS`` / delta, t is
  lowered while the Wilson upper bound (``CONFIDENCE`` standard deviations) of their wrong
  rate stays within delta, and stops at the first bin where it does not; it never comes
  down past the lowest bin that holds a pair (no hit is served on no evidence). Of the
  levels, the quadrant that holds the most pairs is served.
- **Prior**: the same counts on QQP dev pairs the contract veto passes (out-of-fold verifier
  scores; :func:`calibrate`, ``bound_prior.json``), worth ``PRIOR_WEIGHT`` pairs in all: too
  few to open a quadrant at delta 0.02 alone; a cold cache serves no semantic hit until it
  has learnt.
- **Per entry**: an entry whose answer was once wrong for a question is never served again
  for one no closer (cosine and verifier score both at most the wrong one's).
- **Exploration**: a hit within the bound goes upstream anyway with probability
  ``explore_share`` and is compared: the served region keeps being checked. (Every miss
  with a candidate is compared too, at no extra upstream call.)

All state is in process memory (per replica), bounded by ``max_groups`` groups (each
starts from the shared prior; ~10 KB) and ``max_entries`` remembered entries, both shared by
gateway keys as :class:`~gateway.tenant_lru.TenantLRU` shares them: past a bound, the key
holding the most gives up its least recently used, so a key making namespaces without end
forgets its own. Pure: no I/O.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import orjson

from gateway.cache.backend import tenant_of
from gateway.tenant_lru import TenantLRU

__all__ = ["LEVELS", "PRIOR", "BoundStats", "Decision", "ErrorBound", "Prior", "calibrate"]

#: Cosine bins of COS_BIN over [0.5, 1] (lower cosines fall in the first).
COS_BIN = 0.005
_NC = 101
#: Verifier levels: a pair's level is the highest whose score it reaches.
LEVELS = (0.0, 0.5, 0.9, 0.99, 0.999, 0.9999)
#: A quadrant is tested once it holds MIN_PAIRS / delta pairs.
MIN_PAIRS = 3.0
#: Prior pairs' weight in all: live outcomes outweigh the prior after about this many.
PRIOR_WEIGHT = 200.0
#: Standard deviations of the Wilson upper bound (one-sided ~84%).
CONFIDENCE = 1.0
#: Live outcomes fade by this factor each (an effective memory of ~5000 outcomes).
FORGET = 1 - 1 / 5000
PRIOR = Path(__file__).with_name("bound_prior.json")

Decision = Literal["serve", "explore", "miss"]


def _cell(cosine: float, score: float) -> tuple[int, int]:
    """A pair's (cosine bin, verifier level)."""
    level = sum(score >= v for v in LEVELS[1:])
    return min(_NC - 1, max(0, int((cosine - 0.5) / COS_BIN + 1e-9))), level


def _wilson_uppers(wrong: np.ndarray, n: np.ndarray, sd: float) -> np.ndarray:
    """The Wilson score interval's upper end for ``wrong`` of ``n``, cell by cell (1.0 where
    n is 0)."""
    safe = np.maximum(n, 1e-12)
    p = np.minimum(1.0, wrong / safe)
    upper = (p + sd * sd / (2 * safe) + sd * np.sqrt(p * (1 - p) / safe
                                                     + sd * sd / (4 * safe * safe))) / (
        1 + sd * sd / safe)
    return np.where(n > 0, np.minimum(1.0, upper), 1.0)


def _name(namespace: str, group: str) -> str:
    """A (namespace, group) pair as one key, unambiguously."""
    return f"{len(namespace)}:{namespace}{group}"


def _grid() -> np.ndarray:
    return np.zeros((_NC, len(LEVELS)))


@dataclass(frozen=True, slots=True)
class Prior:
    """Outcome counts per (cosine bin, verifier level): ``wrong`` and ``total``."""

    wrong: np.ndarray
    total: np.ndarray

    @classmethod
    def empty(cls) -> Prior:
        return cls(_grid(), _grid())

    @classmethod
    def load(cls, path: Path = PRIOR) -> Prior:
        """The shipped prior (``bound_prior.json``); empty when the file is missing."""
        if not path.exists():
            return cls.empty()
        doc = orjson.loads(path.read_bytes())
        return cls(np.asarray(doc["wrong"], float), np.asarray(doc["total"], float))

    def cosine_only(self) -> Prior:
        """This prior with every pair at the lowest verifier level (for a verifier whose
        scores it was not measured on)."""
        wrong, total = _grid(), _grid()
        wrong[:, 0], total[:, 0] = self.wrong.sum(1), self.total.sum(1)
        return Prior(wrong, total)

    def dump(self, path: Path, source: str) -> None:
        path.write_bytes(orjson.dumps({
            "source": source, "cosine_bin": COS_BIN, "levels": LEVELS,
            "wrong": self.wrong.round(4).tolist(), "total": self.total.round(4).tolist()}))


def calibrate(cosines: Sequence[float], scores: Sequence[float], wrong: Sequence[bool],
              weight: float = PRIOR_WEIGHT) -> Prior:
    """A prior from labelled pairs (their ``cosines``, verifier ``scores`` and whether the
    answers differ), worth ``weight`` pairs in all."""
    prior = Prior.empty()
    each = weight / max(1, len(wrong))
    for c, s, w in zip(cosines, scores, wrong, strict=True):
        cell = _cell(c, s)
        prior.total[cell] += each
        prior.wrong[cell] += each * bool(w)
    return prior


@dataclass(slots=True)
class _Group:
    """One group's outcome counts (the prior's included) and its served quadrant."""

    wrong: np.ndarray
    total: np.ndarray
    quadrant: tuple[int, int]


@dataclass
class BoundStats:
    """Counters for /metrics and benchmarks: decisions by kind, outcomes learnt."""

    decisions: dict[str, int] = field(default_factory=dict)
    learnt: dict[bool, int] = field(default_factory=dict)


class ErrorBound:
    """Decides, per candidate hit, serve / explore / miss under ``delta``; learns outcomes.

    ``rng``: a [0, 1) sampler for exploration (seeded in benchmarks). Each method's
    ``namespace`` is the cache namespace of the entries compared (a gateway key's, or
    ``KEY/NAME``): a group is a (namespace, ``group``) pair."""

    def __init__(self, delta: float, explore_share: float, prior: Prior | None = None,
                 rng: Callable[[], float] = random.random, max_entries: int = 100_000,
                 confidence: float = CONFIDENCE, max_groups: int = 1024) -> None:
        self.delta, self.explore_share, self.confidence = delta, explore_share, confidence
        self.prior = prior if prior is not None else Prior.load()
        self.rng, self.max_entries = rng, max_entries
        self.stats = BoundStats()
        #: (namespace, group) -> its counts and quadrant; each counts 1 against max_groups
        self._groups: TenantLRU[_Group] = TenantLRU(max_groups)
        self._cold = self._quadrant(self.prior.wrong, self.prior.total)
        #: entry -> (cosine, verifier score) pairs at which its answer was wrong
        self._wrong: TenantLRU[list[tuple[float, float]]] = TenantLRU(max_entries)

    def configure(self, delta: float, explore_share: float) -> None:
        """New settings (a policy reload); the quadrants follow a new delta at once."""
        self.explore_share = explore_share
        if delta != self.delta:
            self.delta = delta
            self._cold = self._quadrant(self.prior.wrong, self.prior.total)
            for g in self._groups.values():
                g.quadrant = self._quadrant(g.wrong, g.total)

    def _quadrant(self, wrong: np.ndarray, total: np.ndarray) -> tuple[int, int]:
        """The served quadrant as (lowest cosine bin, lowest level); (``_NC``, 0), serving
        nothing, when no quadrant passes. Per level, from the top bin down: a bin is tested
        when its quadrant holds a pair more than the bin above's and at least MIN_PAIRS /
        delta in all; the first failure ends the sequence; t is the lowest bin passed."""
        # suffix sums: [c, l] = the pairs at cosine bin >= c and level >= l
        w = wrong[::-1, ::-1].cumsum(0).cumsum(1)[::-1, ::-1]
        n = total[::-1, ::-1].cumsum(0).cumsum(1)[::-1, ::-1]
        above = np.vstack([n[1:], np.zeros((1, n.shape[1]))])  # the bin above's quadrant
        tested = (n > above) & (n >= MIN_PAIRS / self.delta)
        passed = _wilson_uppers(w, n, self.confidence) <= self.delta
        best, held = (_NC, 0), 0.0
        for level in range(len(LEVELS)):
            bins = np.flatnonzero(tested[:, level])[::-1]  # top down
            ok = passed[bins, level]
            if not ok.any():
                continue
            first_fail = int(np.argmin(ok)) if not ok.all() else len(ok)
            if first_fail == 0:
                continue
            t = int(bins[first_fail - 1])
            if n[t, level] > held:
                best, held = (t, level), float(n[t, level])
        return best

    def serves(self, group: str, entry: str, cosine: float, score: float,
               namespace: str = "") -> bool:
        """Whether the pair is in the group's quadrant (and ``entry`` was never wrong for a
        question no closer)."""
        if any(c >= cosine and s >= score for c, s in self._wrong.get(entry) or ()):
            return False
        g = self._groups.get(_name(namespace, group))
        c0, l0 = g.quadrant if g is not None else self._cold
        c, level = _cell(cosine, score)
        return c >= c0 and level >= l0

    def decide(self, group: str, entry: str, cosine: float, score: float,
               namespace: str = "") -> Decision:
        """``serve`` (within delta), ``explore`` (within delta, but checked this time) or
        ``miss``."""
        if not self.serves(group, entry, cosine, score, namespace):
            decision: Decision = "miss"
        elif self.rng() < self.explore_share:
            decision = "explore"
        else:
            decision = "serve"
        self.stats.decisions[decision] = self.stats.decisions.get(decision, 0) + 1
        return decision

    def learn(self, group: str, entry: str, cosine: float, score: float, right: bool,
              namespace: str = "") -> None:
        """An outcome: ``entry``'s answer was ``right`` (or not) for a question at ``cosine``
        and verifier ``score``; it moves its own group's bound only."""
        name, tenant = _name(namespace, group), tenant_of(namespace)
        g = self._groups.get(name)
        if g is None:
            g = _Group(self.prior.wrong.copy(), self.prior.total.copy(), self._cold)
            self._groups.put(tenant, name, g, 1)
        g.wrong *= FORGET
        g.total *= FORGET
        cell = _cell(cosine, score)
        g.total[cell] += 1
        g.wrong[cell] += not right
        g.quadrant = self._quadrant(g.wrong, g.total)
        if not right:
            pairs = self._wrong.get(entry)
            if pairs is None:
                self._wrong.put(tenant, entry, [(cosine, score)], 1)
            else:
                pairs.append((cosine, score))
        self.stats.learnt[right] = self.stats.learnt.get(right, 0) + 1
