"""The config schema's errors name the key that is wrong, also inside optional tables."""

from __future__ import annotations

import dataclasses

import pytest

from gateway.errors import ConfigError
from gateway.schema import parse


@dataclasses.dataclass(frozen=True)
class Inner:
    n: int = 1


@dataclasses.dataclass(frozen=True)
class Outer:
    inner: Inner | None = None


@pytest.mark.parametrize(("value", "message"), [
    ({"inner": {"n": "x"}}, "f.toml: inner.n: expected an integer, got 'x'"),
    ({"inner": {"m": 1}}, "f.toml: inner.m: unknown key; allowed keys: n"),
    ({"inner": 3}, "f.toml: inner: expected a table or absent, got 3"),
])
def test_an_optional_table_reports_the_key_inside_it(value, message):
    with pytest.raises(ConfigError) as info:
        parse(Outer, value, "f.toml")
    assert str(info.value) == message


def test_an_optional_table_parses_or_stays_absent():
    assert parse(Outer, {"inner": {"n": 2}}, "f.toml") == Outer(Inner(2))
    assert parse(Outer, {}, "f.toml") == Outer()
