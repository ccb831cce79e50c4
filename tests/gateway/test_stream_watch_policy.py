"""Policy ``[stream_watch]``: defaults, a model's own values over the section's, strict keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.errors import ConfigError
from gateway.policy import load_policy


def test_defaults_a_learned_deadline_and_an_idle_timeout(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text("version = 'x'\n")
    rule = load_policy(path).stream_watch.rule("any")
    assert (rule.first_token_ms, rule.first_token_percentile, rule.first_token_factor,
            rule.first_token_floor_ms, rule.first_token_min_samples) == (0, 0.95, 1.5, 1000, 50)
    assert (rule.stream_idle_timeout_ms, rule.min_tokens_per_s) == (60_000, 0)


def test_a_models_own_values_over_the_sections(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text("[stream_watch]\nstream_idle_timeout_ms = 20000\n"
                    "[stream_watch.models.'o3-pro']\nfirst_token_factor = 0\n"
                    "stream_idle_timeout_ms = 0\n"
                    "[stream_watch.models.fast]\nfirst_token_ms = 800\n")
    watch = load_policy(path).stream_watch
    assert watch.rule("o3-pro").first_token_factor == 0
    assert watch.rule("o3-pro").stream_idle_timeout_ms == 0
    assert watch.rule("fast").first_token_ms == 800
    assert watch.rule("fast").stream_idle_timeout_ms == 20000  # the section's
    assert watch.rule("other") is watch and watch.rule("fast") is watch.rule("fast")


def test_unknown_keys_and_bad_values_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text("[stream_watch]\nfirst_token_timeout = 3\n")
    with pytest.raises(ConfigError, match="stream_watch.first_token_timeout: unknown key"):
        load_policy(path)
    path.write_text("[stream_watch.models.m]\nfirst_token_percentile = 1.5\n")
    with pytest.raises(ConfigError, match="first_token_percentile: must be <= 1"):
        load_policy(path)
