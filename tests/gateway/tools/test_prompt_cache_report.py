"""``gateway prompt-cache report LOG``: the cached share, writes and input cost by model, read
from request log lines as the gateway writes them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.cli import main


def request(model: str, prompt: int | None, read: int | None, written: int | None,
            **extra: Any) -> bytes:
    return orjson.dumps({"event": "request", "model_requested": "alias", "model_served": model,
                         "status": 200, "prompt_tokens": prompt, "cache_read_tokens": read,
                         "cache_write_tokens": written, **extra})


@pytest.fixture
def log(tmp_path: Path) -> Path:
    lines = [
        b'{"event": "gateway_started", "level": "info"}',  # not a request line
        request("claude-sonnet-4-6", 10_000, 8_000, 1_000),
        b"not json at all",
        request("claude-sonnet-4-6", 2_000, 0, 2_000),
        request("gpt-4o-2024-08-06", 4_000, 3_072, None),  # OpenAI reports no writes
        request("smollm2", 1_000, 512, None),  # no known price: no savings claimed
        request("gpt-4o-2024-08-06", None, None, None, status=503),  # no usage: left out
    ]
    path = tmp_path / "gateway.log"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def report_json(path: Path, capsys: pytest.CaptureFixture[str], *options: str) -> Any:
    assert main(["prompt-cache", "report", str(path), "--json", *options]) == 0
    return orjson.loads(capsys.readouterr().out)


def test_the_report_prices_each_model_at_its_providers_multipliers(
        log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = report_json(log, capsys)
    assert list(out) == ["claude-sonnet-4-6", "gpt-4o-2024-08-06", "smollm2", "all"]
    claude, gpt, local, total = out.values()
    # claude: 1,000 uncached + 8,000 read at 0.1 + 3,000 written at 1.25 = 5,550 of 12,000
    assert (claude["requests"], claude["prompt_tokens"], claude["cache_read_tokens"],
            claude["cache_write_tokens"]) == (2, 12_000, 8_000, 3_000)
    assert (claude["cached_share"], claude["relative_cost"]) == (0.6667, 0.4625)
    # gpt-4o: 928 uncached + 3,072 cached at 0.5 = 2,464 of 4,000
    assert (gpt["cached_share"], gpt["relative_cost"], gpt["read_multiplier"]) == (
        0.768, 0.616, 0.5)
    assert (local["cached_share"], local["relative_cost"]) == (0.512, 1.0)
    assert (total["requests"], total["prompt_tokens"], total["cache_read_tokens"]) == (
        4, 17_000, 11_584)
    assert total["relative_cost"] == round((5_550 + 2_464 + 1_000) / 17_000, 4)
    assert total["read_multiplier"] is None  # mixed


def test_multipliers_can_be_overridden_for_every_model(
        log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = report_json(log, capsys, "--read-multiplier", "0.2", "--write-multiplier", "2")
    # claude: 1,000 + 8,000 x 0.2 + 3,000 x 2 = 8,600 of 12,000
    assert out["claude-sonnet-4-6"]["relative_cost"] == round(8_600 / 12_000, 4)
    assert (out["all"]["read_multiplier"], out["all"]["write_multiplier"]) == (0.2, 2.0)


def test_the_table_names_each_model_with_its_share_and_cost(
        log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["prompt-cache", "report", str(log)]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()}
    assert rows["claude-sonnet-4-6"][1:6] == ["2", "12,000", "66.7%", "3,000", "46.2%"]
    assert rows["gpt-4o-2024-08-06"][1:6] == ["1", "4,000", "76.8%", "0", "61.6%"]
    assert rows["all"][-1] == "mixed"


def test_a_missing_log_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["prompt-cache", "report", str(tmp_path / "nope.log")]) == 2
    assert "no such log file" in capsys.readouterr().err
