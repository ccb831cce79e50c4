"""Whether compressing a prompt pays: the predicted prefill time saved against the
compressor's own predicted time.

An independent study of prompt compressors (arXiv 2604.02985) found end-to-end gains of at
most 18%, and losses wherever the compressor's own time exceeded the prefill it saved. The
gate compresses only when::

    saved_tokens x prefill_ms_per_token + saved_tokens / 1000 x cost_weight
        > compressor_ms + margin_ms

``saved_tokens`` is the compressible tokens x (1 - 1 / target_ratio); ``prefill_ms_per_token``
is the upstream model's, set in the policy or learned online (:class:`PrefillRate`, the slope
of its time to first token against its uncached prompt tokens, at its lower confidence
bound); ``compressor_ms`` is the compressor's
learned ms per 1,000 tokens (:class:`CompressorRate`) x the compressible tokens / 1000;
``cost_weight``: the milliseconds of latency an operator trades for 1,000 input tokens not
billed (0: latency only). Pure, apart from the learned rates' state.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass

__all__ = ["CompressorRate", "GateDecision", "PrefillRate", "decide"]


@dataclass(frozen=True, slots=True)
class GateDecision:
    """``compress``: whether to; ``skip``: why not (None when compressing); the predicted
    ``saved_ms`` (prefill time, ms; None without a prefill rate) and ``cost_ms`` (the
    compressor's time, ms); ``saved_tokens``: predicted."""

    compress: bool
    skip: str | None
    saved_tokens: int
    saved_ms: float | None
    cost_ms: float


def decide(tokens: int, target_ratio: float, prefill_ms_per_token: float | None,
           compressor_ms_per_1k: float, *, margin_ms: float = 0.0,
           cost_weight: float = 0.0) -> GateDecision:
    """The gate for a prompt with ``tokens`` compressible tokens, cut ``target_ratio`` times.
    Skip reasons: ``no_prefill_rate`` (none set nor learned yet, and no cost weight) and
    ``not_worth_it`` (the predicted saving does not beat the compressor's time + margin)."""
    saved_tokens = max(0, round(tokens * (1 - 1 / target_ratio))) if target_ratio > 1 else 0
    cost_ms = compressor_ms_per_1k * tokens / 1000
    saved_ms = None if prefill_ms_per_token is None else saved_tokens * prefill_ms_per_token
    if saved_ms is None and cost_weight <= 0:
        return GateDecision(False, "no_prefill_rate", saved_tokens, None, cost_ms)
    value = (saved_ms or 0.0) + saved_tokens / 1000 * cost_weight
    if value > cost_ms + margin_ms:
        return GateDecision(True, None, saved_tokens, saved_ms, cost_ms)
    return GateDecision(False, "not_worth_it", saved_tokens, saved_ms, cost_ms)


class PrefillRate:
    """A model's prefill time per prompt token (ms), learned from what it answers: the
    least-squares slope of time to first token (ms, queueing excluded) against the prompt
    tokens it had to prefill (those not read from its prompt cache)
    over the last ``window`` streamed answers, taken at its lower confidence bound (slope -
    ``z`` standard errors, at least 0). Time / tokens would credit network and queueing time
    to prefill; the slope does not, and the bound keeps a noisy fit (a fast hosted model,
    whose prefill is lost in network jitter) from claiming a saving it cannot show. None
    until ``min_samples`` answers of at least two prompt lengths were seen."""

    __slots__ = ("_points", "min_samples", "z")

    def __init__(self, window: int = 256, min_samples: int = 8, z: float = 2.0) -> None:
        self._points: collections.deque[tuple[int, float]] = collections.deque(maxlen=window)
        self.min_samples = min_samples
        self.z = z

    def observe(self, prompt_tokens: int, ttft_ms: float) -> None:
        if prompt_tokens > 0 and ttft_ms >= 0 and math.isfinite(ttft_ms):
            self._points.append((prompt_tokens, ttft_ms))

    @property
    def ms_per_token(self) -> float | None:
        points = self._points
        n = len(points)
        if n < max(self.min_samples, 3):
            return None
        mean_x = sum(x for x, _ in points) / n
        mean_y = sum(y for _, y in points) / n
        sxx = sum((x - mean_x) ** 2 for x, _ in points)
        if sxx == 0:
            return None
        slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sxx
        residual = sum((y - mean_y - slope * (x - mean_x)) ** 2 for x, y in points)
        stderr = math.sqrt(residual / (n - 2) / sxx)
        return max(0.0, slope - self.z * stderr)


class CompressorRate:
    """The compressor's own cost (ms per 1,000 tokens of context), an exponentially weighted
    mean of its measured runs, starting from ``prior`` (the policy's figure)."""

    __slots__ = ("alpha", "ms_per_1k")

    def __init__(self, prior: float, alpha: float = 0.2) -> None:
        self.ms_per_1k = prior
        self.alpha = alpha

    def observe(self, tokens: int, ms: float) -> None:
        if tokens >= 100 and ms >= 0:
            self.ms_per_1k += self.alpha * (ms * 1000 / tokens - self.ms_per_1k)
