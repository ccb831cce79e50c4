"""The deployment secret: from the environment (shared by replicas), else generated once and
kept in a file only its owner reads, else a process's own with a warning; and the
prompt_cache_key values made under it."""

from __future__ import annotations

import os
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import structlog

from gateway.errors import ConfigError
from gateway.prompt_cache.cache_keys import CacheKeys
from gateway.secret import SecretConfig, load_secret


@pytest.fixture(autouse=True)
def no_secret_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("GATEWAY_SECRET", raising=False)
    monkeypatch.setenv("GATEWAY_CACHE_DIR", str(tmp_path / "cache"))


def test_the_environment_wins_and_must_be_long_enough(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    monkeypatch.setenv("MY_SECRET", "x" * 32)
    assert load_secret(SecretConfig(env="MY_SECRET")) == b"x" * 32
    assert not (tmp_path / "cache" / "secret").exists()  # nothing written
    monkeypatch.setenv("GATEWAY_SECRET", "short")
    with pytest.raises(ConfigError, match="secret.env: GATEWAY_SECRET must hold at least 32"):
        load_secret(SecretConfig(), "gateway.toml")


def test_without_one_a_secret_is_made_once_and_kept_for_its_owner(tmp_path: Path) -> None:
    first = load_secret(SecretConfig())
    path = tmp_path / "cache" / "secret"
    assert len(first) == 32 and path.read_bytes() == first
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_secret(SecretConfig()) == first  # a restart: the same secret
    with ThreadPoolExecutor(4) as pool:  # replicas starting at once on one disk agree
        elsewhere = tmp_path / "other" / "secret"
        found = set(pool.map(lambda _: load_secret(SecretConfig(file=str(elsewhere))),
                             range(8)))
    assert len(found) == 1 and found != {first}
    assert [p.name for p in elsewhere.parent.iterdir()] == ["secret"]  # no temp file left


def test_a_kept_secret_others_may_read_is_used_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "shared"
    path.write_bytes(b"z" * 32)
    path.chmod(0o644)
    with structlog.testing.capture_logs() as logs:
        assert load_secret(SecretConfig(file=str(path))) == b"z" * 32
    assert [e["event"] for e in logs] == ["secret_file_readable_by_others"]


def test_a_file_holding_no_secret_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "empty"
    path.write_bytes(b"")
    with pytest.raises(ConfigError, match="secret.file: .*empty holds no secret"):
        load_secret(SecretConfig(file=str(path)))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_an_unwritable_folder_gives_a_secret_of_this_process_and_a_warning(
        tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o500)
    with structlog.testing.capture_logs() as logs:
        one = load_secret(SecretConfig(file=str(folder / "secret")))
    assert len(one) == 32 and load_secret(SecretConfig(file=str(folder / "secret"))) != one
    assert [e["event"] for e in logs] == ["secret_not_kept"]


def test_an_unwritable_path_gives_a_secret_of_this_process_and_a_warning(
        tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with structlog.testing.capture_logs() as logs:
        one = load_secret(SecretConfig(file=str(blocker / "secret")))
    assert len(one) == 32
    assert [(e["event"], e["log_level"]) for e in logs] == [("secret_not_kept", "warning")]
    assert "x" * 32 not in str(logs)


def test_cache_keys_are_hmacs_apart_by_kind_key_and_secret() -> None:
    keys, other = CacheKeys(b"k" * 32), CacheKeys(b"l" * 32)
    derived = keys.derived("team-a", None, [{"role": "system", "content": "S"}])
    assert derived.startswith("gw-") and len(derived) == 19
    assert derived == keys.derived("team-a", None, [{"role": "system", "content": "S"}])
    assert derived != keys.derived("team-b", None, [{"role": "system", "content": "S"}])
    assert derived != other.derived("team-a", None, [{"role": "system", "content": "S"}])
    own = keys.client("team-a", "conv-1")
    assert own.startswith("gwk-") and len(own) == 36 and own == keys.client("team-a", "conv-1")
    assert own != keys.client("team-b", "conv-1") != keys.client(None, "conv-1")
    assert keys.client("team-a", derived) != derived  # another key's value never passes
    # the key id's length is part of the message: no id/value split makes another's
    assert keys.client("a", "bc") != keys.client("ab", "c")
    assert len(keys.client("team-a", "x" * 10_000)) == 36
