"""Verifier v3 (the shipped cross-encoder) at the shipped operating point: it loads with no
network, scores a batch, rejects one pair of each hard-negative kind and serves the live
paraphrase of issue 17; the policy picks the verifier."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gateway.cache.cross_verifier import ARTIFACT, VERSION, CrossVerifier
from gateway.cache.policy_verifier import PolicyVerifier, VerifierKind
from gateway.errors import ConfigError
from gateway.policy import load_policy

ROOT = Path(__file__).resolve().parents[3]
POLICY = load_policy(ROOT / "policies" / "default.toml").cache
#: The dev-calibrated threshold of the v3 artifact trained so far (the shipped policy still
#: names the MLP, whose operating point is another scale).
THRESHOLD = 0.8
needs_artifact = pytest.mark.skipif(not ARTIFACT.exists(), reason=f"no {ARTIFACT.name}: "
                                    "train it with python -m gateway.tools.train_cross_verifier")


@pytest.fixture(scope="module")
def verifier() -> CrossVerifier:
    return CrossVerifier()


def test_the_policy_names_a_verifier_that_ships() -> None:
    assert POLICY.verifier in ("mlp", "cross")
    assert POLICY.verifier == "mlp" or ARTIFACT.exists()


@needs_artifact
def test_artifact_is_versioned_small_and_loads_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise OSError("no network in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    assert VERSION in ARTIFACT.name
    assert ARTIFACT.stat().st_size < 25 * 2**20
    loaded = CrossVerifier()
    assert loaded.version == VERSION
    scores = loaded.score_pairs([("How do I learn Python?", "How can I learn Python?")] * 3
                                + [("How do I learn Python?", "How tall is Mount Everest?")])
    assert scores.shape == (4,) and np.all((scores >= 0) & (scores <= 1))
    assert scores[0] == pytest.approx(scores[1])  # the batch's padding changes nothing
    assert scores[3] < scores[0]
    assert loaded.score_pairs([]).shape == (0,)


@needs_artifact
@pytest.mark.parametrize(("kind", "a", "b"), [
    ("direction", "How do I convert Celsius to Fahrenheit?",
     "How do I convert Fahrenheit to Celsius?"),
    ("number", "How many calories should I eat to lose 5 kg?",
     "How many calories should I eat to lose 15 kg?"),
    ("negation", "Why is Python a good first language?",
     "Why is Python not a good first language?"),
    ("entity", "What is the best way to get a job in Canada?",
     "What is the best way to get a job in Germany?"),
])
def test_rejects_each_hard_negative_kind(verifier: CrossVerifier, kind: str, a: str,
                                         b: str) -> None:
    assert verifier.score(a, b) < THRESHOLD, kind
    assert verifier.score(b, a) < THRESHOLD, kind


@needs_artifact
def test_serves_the_live_paraphrase(verifier: CrossVerifier) -> None:
    # issue 17: cosine 0.957, the MLP scored it 0.84 against its 0.95
    score = verifier.score("What is the capital of France?",
                           "What's the capital city of France?")
    assert score >= THRESHOLD


class _Fixed:
    def __init__(self, version: str, value: float) -> None:
        self.version, self.value = version, value

    def score(self, a: str, b: str, u: np.ndarray, v: np.ndarray) -> float:
        return self.value


def test_policy_switch_picks_the_named_verifier() -> None:
    kind: list[VerifierKind] = ["cross"]
    chosen = PolicyVerifier(lambda: kind[0], {"cross": _Fixed("v3", 0.9),
                                              "mlp": _Fixed("v2", 0.2)})
    u = np.ones(4, dtype=np.float32) / 2
    assert (chosen.version, chosen.score("a", "b", u, u)) == ("v3", 0.9)
    kind[0] = "mlp"  # a policy reload
    assert (chosen.version, chosen.score("a", "b", u, u)) == ("v2", 0.2)


def test_a_missing_artifact_never_serves() -> None:
    chosen = PolicyVerifier(lambda: "cross", {"cross": None})
    u = np.ones(4, dtype=np.float32) / 2
    assert chosen.score("a", "a", u, u) == 0.0 and chosen.version == "missing"
    with pytest.raises(FileNotFoundError):
        CrossVerifier(ARTIFACT.with_name("absent.onnx"))


def test_policy_rejects_an_unknown_verifier(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text('[cache]\nverifier = "bm25"\n')
    with pytest.raises(ConfigError, match="verifier"):
        load_policy(path)
