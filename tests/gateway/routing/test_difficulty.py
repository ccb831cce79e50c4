"""The shipped router artifact: it loads offline, decides the same way every time, and its
calibration turns policy targets into sensible thresholds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest

from gateway.policy import RouterPolicy
from gateway.routing.decision import Routers
from gateway.routing.difficulty import Router, artifact_path
from gateway.routing.features import FEATURE_NAMES, text_features

ROOT = Path(__file__).resolve().parents[3]
MULTI_STEP = ("Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning "
              "and bakes muffins for her friends every day with four. She sells the remainder "
              "at the farmers' market daily for $2 per fresh duck egg. How much in dollars "
              "does she make every day at the farmers' market?")
FACT = "What is the capital of France?\nA. Paris\nB. Rome\nC. Madrid\nD. Berlin\nAnswer:"


@pytest.fixture(scope="module")
def shipped() -> Router:
    return Router(artifact_path("default"))


@pytest.fixture(scope="module")
def embedder():
    from local_engine.embedder import Embedder

    return Embedder.load()


def test_artifact_is_small_and_versioned(shipped):
    assert artifact_path("default").stat().st_size < 1_000_000
    assert shipped.version.startswith("routellm-dev")
    assert shipped.dim == 384


def test_scores_are_deterministic_and_bounded(shipped, embedder):
    vectors = embedder([MULTI_STEP, FACT])
    first = [shipped.score(v, text_features(t)) for v, t in zip(vectors, [MULTI_STEP, FACT])]
    again = [shipped.score(v, text_features(t)) for v, t in zip(embedder([MULTI_STEP, FACT]),
                                                                 [MULTI_STEP, FACT])]
    assert first == pytest.approx(again, abs=1e-6)
    assert all(-1.0 <= s <= 1.0 for s in first)
    # A multi-step word problem needs the strong model more than a one-fact question.
    threshold = shipped.threshold(0.95)
    assert first[0] >= threshold > first[1]


def test_threshold_follows_the_target(shipped):
    loose, strict = shipped.threshold(0.9), shipped.threshold(0.99)
    assert strict < loose  # more quality -> more traffic reaches the strong tier
    assert shipped.threshold(strong_share=1.0) == -1.0
    half = shipped.threshold(strong_share=0.5)
    share = (shipped.calibration.thresholds[:-1] >= half).mean()
    assert share == pytest.approx(0.5, abs=0.01)
    stage = Routers()
    assert stage.threshold(RouterPolicy(threshold=0.3)) == 0.3
    assert stage.threshold(RouterPolicy()) == shipped.threshold(0.95)


def test_wrong_artifact_is_refused(tmp_path):
    path = tmp_path / "bad.npz"
    np.savez(path, feature_names=np.array(["something_else"]))
    with pytest.raises(ValueError, match="other text features"):
        Router(path)
    assert len(text_features("x")) == len(FEATURE_NAMES)


def test_route_eval_prints_one_line_per_prompt(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(orjson.dumps(r).decode() for r in [
        {"id": "a", "prompt": MULTI_STEP, "weak_correct": False, "strong_correct": True},
        {"id": "b", "prompt": FACT, "weak_correct": True, "strong_correct": True},
    ]) + "\n")
    result = subprocess.run([sys.executable, "-m", "gateway.cli", "route", "eval", "--prompts",
                             str(prompts)], cwd=ROOT, capture_output=True, text=True, check=True)
    lines = [orjson.loads(line) for line in result.stdout.splitlines()]
    assert [line["id"] for line in lines] == ["a", "b"]
    assert [line["tier"] for line in lines] == ["large", "small"]
    assert all(set(line) == {"index", "id", "score", "threshold", "tier"} for line in lines)
    summary = orjson.loads(result.stderr.strip().splitlines()[-1])
    assert summary["weak_share"] == 0.5 and summary["quality_vs_strong"] == 1.0


def test_route_eval_rejects_unknown_router_and_bad_lines(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"text": "no prompt field"}\n')
    run = [sys.executable, "-m", "gateway.cli", "route", "eval", "--prompts", str(prompts)]
    bad_line = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, check=False)
    assert bad_line.returncode == 2 and "has no string 'prompt'" in bad_line.stderr
    unknown = subprocess.run(run + ["--router", "nope"], cwd=ROOT, capture_output=True,
                             text=True, check=False)
    assert unknown.returncode == 2 and "no router 'nope'" in unknown.stderr
