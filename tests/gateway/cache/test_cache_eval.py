"""``gateway cache eval`` decides pairs as the cache does: the contract first, then the error
bound from a cold start (or, with ``max_error_rate = 0``, the static operating point)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[3]
PAIRS = [
    ("How do I convert Celsius to Fahrenheit?", "How do I convert Fahrenheit to Celsius?", 0),
    ("What are the best jobs in India?", "What are the best jobs in Canada?", 0),
    ("Why can't I sleep at night?", "Why can I sleep at night?", 0),
    ("What is 10 km in miles?", "What is 12 km in miles?", 0),
    ("What is the capital of France?", "What's the capital city of France?", 1),
    ("How do I learn Python quickly?", "How can I learn Python fast?", 1),
]


def evaluate(tmp_path: Path, policy: Path) -> dict[str, object]:
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(orjson.dumps({"text_a": a, "text_b": b, "label": y}).decode()
                             + "\n" for a, b, y in PAIRS))
    out = subprocess.run([sys.executable, "-m", "gateway.cli", "cache", "eval", "--pairs",
                          str(pairs), "--policy", str(policy)], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    result: dict[str, object] = orjson.loads(out.stdout)
    return result


def test_swaps_are_refused_and_a_cold_bound_serves_nothing(tmp_path: Path) -> None:
    bounded = evaluate(tmp_path, ROOT / "policies" / "default.toml")
    assert bounded["contract_refused"] == 4 and bounded["max_error_rate"] == 0.02
    assert (bounded["hits"], bounded["wrong_hits"], bounded["precision"]) == (0, 0, 1.0)
    decisions = bounded["decisions"]
    assert isinstance(decisions, list)
    assert [d["contract"] for d in decisions] == [False] * 4 + [True] * 2
    static = tmp_path / "static.toml"
    static.write_text((ROOT / "policies" / "default.toml").read_text().replace(
        "max_error_rate = 0.02", "max_error_rate = 0").replace(
        "operating_point = { similarity = 0.5, verifier = 0.95 }",
        "operating_point = { similarity = 0.5, verifier = 0.0 }"))
    point = evaluate(tmp_path, static)
    assert (point["hits"], point["wrong_hits"]) == (2, 0)  # only the paraphrases
