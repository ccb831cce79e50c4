"""Config and policy files: strict parsing, messages that name the file, the key and the
allowed values, and `gateway check`."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cli import main
from gateway.config import load_config
from gateway.errors import ConfigError
from gateway.policy import load_policy

BASE = """
[server]
policy = "policy.toml"
[upstreams.up]
type = "openai"
base_url = "http://127.0.0.1:1/v1"
[models.m]
targets = [{ upstream = "up", model = "x" }]
"""


def write(tmp_path: Path, config: str, policy: str = "") -> Path:
    (tmp_path / "policy.toml").write_text(policy)
    path = tmp_path / "gateway.toml"
    path.write_text(config)
    return path


def test_example_config_and_default_policy_are_valid():
    root = Path(__file__).resolve().parents[2]
    config = load_config(root / "gateway.example.toml")
    assert config.server.port == 8080
    assert load_policy(config.policy_path).retry.max_attempts >= 1


def test_a_local_engine_is_given_longer_to_answer_than_a_hosted_api(tmp_path):
    """A unary answer from the local engine is one silence as long as its generation."""
    config = load_config(write(tmp_path, BASE + """
[upstreams.short]
type = "openai"
base_url = "http://127.0.0.1:2/v1"
read_timeout_ms = 5000
[upstreams.engine]
type = "local"
"""))
    timeouts = {name: up.read_timeout_s for name, up in config.upstreams.items()}
    assert timeouts == {"up": 120.0, "short": 5.0, "engine": 600.0}


def test_relative_policy_path_resolves_against_the_config_folder(tmp_path):
    config = load_config(write(tmp_path, BASE))
    assert config.policy_path == tmp_path / "policy.toml"


@pytest.mark.parametrize(("extra", "key", "fragment"), [
    ("[server]\nprot = 1\n", "server.prot", ("allowed keys: body_timeout_s, drain_timeout_s, "
     "header_timeout_s, host, keep_alive_s, max_body_bytes, max_connections, "
     "max_connections_per_client, max_header_bytes, metrics_host, metrics_key_env, "
     "metrics_port, policy, policy_reload, port, send_timeout_s")),
    ('[upstreams.bad]\ntype = "grpc"\n', "upstreams.bad.type", "one of 'openai'"),
    ('[upstreams.bad]\ntype = "openai"\n', "upstreams.bad", "needs base_url"),
    ("[server]\nport = 70000\n", "server.port", "must be <= 65535"),
    ('[server]\nport = "80"\n', "server.port", "expected an integer"),
    ('[models.n]\ntargets = [{ upstream = "nope", model = "x" }]\n',
     "models.n.targets[0].upstream", "unknown upstream 'nope'; defined upstreams: up"),
    ('[models.n]\ntargets = [{ upstream = "up", model = "x" }]\naliases = ["m"]\n',
     "models.n", "already used by 'm'"),
    ('[[auth.keys]]\nid = "a"\n', "auth.keys[0]", "exactly one of key_env, sha256"),
    ('[[auth.keys]]\nid = "team/eng"\nsha256 = "00"\n', "auth.keys[0]", "holds no '/'"),
    ("[responses]\nkey_share = 0\n", "responses.key_share", "must be >= 0.001"),
    ("[cache]\nkey_share = 1.5\n", "cache.key_share", "must be <= 1.0"),
    ('[secret]\nvar = "X"\n', "secret.var", "allowed keys: env, file"),
])
def test_bad_config_names_file_key_and_allowed_values(tmp_path, extra, key, fragment):
    # later tables with the same name would be a TOML error, so splice into a fresh file
    text = BASE.replace("[server]\n", "[server]\n" + extra.split("\n", 1)[1], 1) \
        if extra.startswith("[server]") else BASE + extra
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    message = str(exc.value)
    assert message.startswith(str(path))
    assert f": {key}: " in message
    assert fragment in message


def test_invalid_toml_is_reported_with_the_file(tmp_path):
    path = write(tmp_path, "[server\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(path)


def test_policy_is_strict_too(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text("[retry]\nmax_attempts = 0\n")
    with pytest.raises(ConfigError, match=r"retry\.max_attempts: must be >= 1"):
        load_policy(path)
    path.write_text("[retyr]\n")
    with pytest.raises(ConfigError, match="allowed keys: admission, balance, breaker, cache, "
                                          "coalesce, compression, degraded, pipeline, "
                                          "prompt_cache, "
                                          "rate_limits, retry, retry_budget, "
                                          "routing, stream_watch, streaming, translation, "
                                          "version"):
        load_policy(path)


def test_gateway_check_validates_without_serving(tmp_path, capsys):
    good = write(tmp_path, BASE)
    assert main(["check", str(good)]) == 0
    assert "ok:" in capsys.readouterr().out
    (tmp_path / "policy.toml").write_text("[retry]\nbase_delay_ms = -1\n")
    assert main(["check", str(good)]) == 2
    err = capsys.readouterr().err
    assert "policy.toml: retry.base_delay_ms: must be >= 0" in err


def test_check_reports_an_unset_gateway_key_variable(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("GATEWAY_TEST_KEY_A", raising=False)
    path = write(tmp_path, BASE + '[[auth.keys]]\nid = "a"\nkey_env = "GATEWAY_TEST_KEY_A"\n')
    assert main(["check", str(path)]) == 2
    assert "auth.keys[a].key_env: environment variable GATEWAY_TEST_KEY_A is not set" in \
        capsys.readouterr().err


SECRET_URL = "redis://:s3cret@redis.internal:6379/0"


def test_redis_urls_can_come_from_the_environment(tmp_path, monkeypatch):
    """A URL with a password need not sit in gateway.toml (nor in a ConfigMap)."""
    monkeypatch.setenv("GW_CACHE_REDIS", SECRET_URL)
    monkeypatch.setenv("GW_RL_REDIS", "rediss://:other@rl.internal:6380/1")
    config = load_config(write(tmp_path, BASE + """
[cache]
enabled = true
backend = "redis"
redis_url_env = "GW_CACHE_REDIS"

[rate_limits]
redis_url_env = "GW_RL_REDIS"
"""))
    assert config.cache.redis_url == SECRET_URL
    assert config.rate_limits.redis_url == "rediss://:other@rl.internal:6380/1"


@pytest.mark.parametrize(("value", "fragment"), [
    (None, "the environment variable GW_CACHE_REDIS is not set"),
    ("http://:s3cret@x/0", "GW_CACHE_REDIS must hold a URL starting with redis://"),
])
def test_a_missing_or_bad_redis_url_env_fails_at_start_naming_the_key(
        tmp_path, monkeypatch, value, fragment):
    if value is None:
        monkeypatch.delenv("GW_CACHE_REDIS", raising=False)
    else:
        monkeypatch.setenv("GW_CACHE_REDIS", value)
    path = write(tmp_path, BASE + '[cache]\nbackend = "redis"\n'
                                  'redis_url_env = "GW_CACHE_REDIS"\n')
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    message = str(exc.value)
    assert ": cache: " in message and fragment in message
    assert "s3cret" not in message  # the value may hold a password: never quoted


def test_redis_url_env_is_not_needed_by_the_memory_backend(tmp_path, monkeypatch):
    monkeypatch.delenv("GW_CACHE_REDIS", raising=False)
    config = load_config(write(tmp_path, BASE + '[cache]\nredis_url_env = "GW_CACHE_REDIS"\n'))
    assert config.cache.backend == "memory"
