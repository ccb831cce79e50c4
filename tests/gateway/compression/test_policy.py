"""``[compression]`` in the policy file: the fine pass's keys, parsed strictly."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.errors import ConfigError
from gateway.policy import load_policy


def policy(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text("[compression]\nenabled = true\n" + body)
    return path


def test_token_level_is_off_by_default_and_can_be_turned_on(tmp_path):
    assert load_policy(policy(tmp_path, "")).compression.token_level is False
    on = load_policy(policy(tmp_path, "token_level = true\n"
                                      "token_level_ms_per_1k_tokens = 250.0\n")).compression
    assert on.token_level is True and on.token_level_ms_per_1k_tokens == 250.0


@pytest.mark.parametrize(("line", "key"), [
    ('token_level = "yes"', "compression.token_level"),
    ("token_level = 1", "compression.token_level"),
    ("token_level_ms_per_1k_tokens = -5.0", "compression.token_level_ms_per_1k_tokens"),
    ("token_levels = true", "token_levels"),
])
def test_bad_values_are_refused_naming_the_key(tmp_path, line, key):
    path = policy(tmp_path, line + "\n")
    with pytest.raises(ConfigError) as exc:
        load_policy(path)
    assert str(exc.value).startswith(str(path)) and key in str(exc.value)
