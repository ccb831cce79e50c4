"""A trained difficulty router: request -> how much the strong tier is expected to help.

Input: the request's all-MiniLM-L6-v2 embedding of the last user message (384 floats, unit
norm; the same vector the semantic cache computes) and the cheap text features of
:mod:`gateway.routing.features`. Output, the *score*: the expected accuracy gain of the
strong tier over the weak one, P(only strong right) - P(only weak right), in [-1, 1]. Routing
a request to the weak tier costs exactly that much expected quality, so sending the
lowest-scoring requests weak keeps the most quality for a given weak-call share. A request
goes to the strong tier when its score reaches the threshold.

Model: an ensemble of a multinomial logistic regression and four one-hidden-layer MLPs over
the three outcomes (only weak right / both or neither / only strong right), numpy at run time
(tens of microseconds a request), trained only on RouteLLM's per-prompt correctness data
(``labeled_prompts_dev.jsonl``; Ong et al., "RouteLLM: Learning to Route LLMs with Preference
Data", arXiv 2406.18665) by :mod:`gateway.tools.train_router`.

The artifact (``artifacts/NAME.npz``, about 0.5 MB) also holds the calibration: the
out-of-fold dev curve of weak-call share and quality (relative to strong-only accuracy) per
threshold, from which :meth:`Router.threshold` turns a policy target into a threshold.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gateway.routing.features import FEATURE_NAMES

__all__ = ["ARTIFACTS", "Router", "artifact_path", "ensemble_gain"]

ARTIFACTS = Path(__file__).with_name("artifacts")


def artifact_path(name: str) -> Path:
    """A shipped router's file (``default`` -> artifacts/default.npz), or ``name`` as a path."""
    if "/" in name or name.endswith(".npz"):
        return Path(name)
    return ARTIFACTS / f"{name}.npz"


Linear = tuple[np.ndarray, np.ndarray]  # w [F, 3], b [3]
Mlp = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # w1 [F, H], b1 [H], w2 [H, 3], b2 [3]


def ensemble_gain(z: np.ndarray, linear: Linear, mlps: list[Mlp]) -> np.ndarray:
    """Standardised inputs z [..., F] -> [...] the ensemble's mean of P(only strong right) -
    P(only weak right), each member a softmax over (only weak right, same, only strong
    right). Shared by training and serving, so the two compute the same score."""
    w, b = linear
    logits = [z @ w + b] + [np.maximum(z @ w1 + b1, 0.0) @ w2 + b2 for w1, b1, w2, b2 in mlps]
    stacked = np.stack(logits)
    p = np.exp(stacked - stacked.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    gain: np.ndarray = (p[..., 2] - p[..., 0]).mean(axis=0)
    return gain


@dataclass(frozen=True, slots=True)
class CalibrationCurve:
    """Out-of-fold dev scores, sorted ascending, with the curve they give: ``weak_share[i]``
    and ``quality[i]`` (fraction of strong-only accuracy) when every prompt scoring below
    ``thresholds[i]`` goes to the weak tier."""

    thresholds: np.ndarray
    weak_share: np.ndarray
    quality: np.ndarray


class Router:
    """Loads an artifact; :meth:`score` is pure numpy. Raises FileNotFoundError or ValueError
    for a missing or malformed artifact."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        with np.load(self.path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
        names = tuple(str(n) for n in data["feature_names"])
        if names != FEATURE_NAMES:
            raise ValueError(f"{self.path}: trained on other text features ({names})")
        self.version = str(data["version"])
        self.dim = int(data["dim"])
        self.mean = data["mean"].astype(np.float32)
        self.scale = data["scale"].astype(np.float32)
        self.linear: Linear = (data["lr_w"].astype(np.float32), data["lr_b"].astype(np.float32))
        self.mlps: list[Mlp] = [
            tuple(data[f"mlp{i}_{k}"].astype(np.float32) for k in ("w1", "b1", "w2", "b2"))
            for i in range(int(data["n_mlp"]))]
        self.calibration = CalibrationCurve(data["cal_thresholds"], data["cal_weak_share"],
                                       data["cal_quality"])

    def inputs(self, vector: np.ndarray, features: np.ndarray) -> np.ndarray:
        """[dim + features] standardised model input."""
        if vector.shape != (self.dim,):
            raise ValueError(f"expected a {self.dim}-dim embedding, got {vector.shape}")
        x = np.concatenate([vector.astype(np.float32), features])
        z: np.ndarray = (x - self.mean) / self.scale
        return z

    def score(self, vector: np.ndarray, features: np.ndarray) -> float:
        """Expected accuracy gain of the strong tier, in [-1, 1]: the ensemble's mean of
        P(only strong right) - P(only weak right)."""
        return float(ensemble_gain(self.inputs(vector, features), self.linear, self.mlps))

    def threshold(self, quality: float | None = None, strong_share: float | None = None
                  ) -> float:
        """The score threshold meeting a target on the dev calibration curve.

        ``quality``: the threshold sending the most traffic to the weak tier while dev quality
        stays at least ``quality`` of strong-only accuracy. ``strong_share``: the threshold
        above which that fraction of dev prompts scores. Default: quality 0.95."""
        cal = self.calibration
        if strong_share is not None:
            if strong_share >= 1.0:
                return -1.0  # every request reaches it
            if strong_share <= 0.0:
                return float(cal.thresholds[-1])  # nothing reaches it: every request goes weak
            return float(np.quantile(cal.thresholds[:-1], 1.0 - strong_share, method="higher"))
        target = 0.95 if quality is None else quality
        ok = np.nonzero(cal.quality >= target - 1e-12)[0]
        if ok.size == 0:
            return -1.0  # unreachable target: every request goes strong
        best = ok[np.argmax(cal.weak_share[ok])]
        return float(cal.thresholds[best])
