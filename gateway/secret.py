"""The deployment's secret: the HMAC key of what the gateway derives and tenants must not
compute (OpenAI ``prompt_cache_key`` values, :mod:`gateway.prompt_cache.cache_keys`).

Where it comes from, first found:

1. the environment variable ``[secret] env`` names (default ``GATEWAY_SECRET``): at least
   32 characters (``openssl rand -hex 32``). Replicas must share it: each derives the same
   keys, so a conversation keeps its provider cache whichever replica serves it;
2. else a file (``[secret] file``, default ``$GATEWAY_CACHE_DIR/secret``, the cache dir
   defaulting to ``~/.cache/llm-gateway``): 32 random bytes written once, readable by its
   owner only (0600), so a restart derives the same keys;
3. else (the file cannot be written: a read-only image) a random secret for this process,
   with a warning: the derived keys change at each start (provider caches go cold once),
   and replicas derive different ones.

Never logged. Source: RFC 2104 (HMAC).
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import structlog

from gateway.errors import ConfigError
from local_engine.paths import cache_dir

__all__ = ["DEFAULT_ENV", "MIN_CHARS", "SecretConfig", "load_secret"]

log = structlog.get_logger("gateway.secret")

DEFAULT_ENV = "GATEWAY_SECRET"
#: The shortest secret taken from the environment (characters): 32 hex digits are 128 bits.
MIN_CHARS = 32
_BYTES = 32


@dataclass(frozen=True)
class SecretConfig:
    """``[secret]``: where the deployment secret comes from (see :mod:`gateway.secret`)."""

    #: The environment variable holding it (shared by replicas).
    env: str = DEFAULT_ENV
    #: Where one is generated and kept when the variable is unset; "" means
    #: ``$GATEWAY_CACHE_DIR/secret`` (default ``~/.cache/llm-gateway/secret``).
    file: str = ""


def load_secret(config: SecretConfig, source: str = "config") -> bytes:
    """The secret's bytes. Raises ConfigError (naming ``source``, the config file) when the
    variable holds fewer than :data:`MIN_CHARS` characters or the file exists but holds no
    secret (the value is never quoted)."""
    value = os.environ.get(config.env)
    if value:
        if len(value) < MIN_CHARS:
            raise ConfigError(source, "secret.env", f"{config.env} must hold at least "
                              f"{MIN_CHARS} characters (e.g. `openssl rand -hex 32`)")
        return value.encode()
    path = Path(config.file) if config.file else cache_dir() / "secret"
    try:
        return _kept(path, source)
    except OSError as exc:
        log.warning("secret_not_kept", path=str(path), error=type(exc).__name__,
                    hint=f"set {config.env} (shared by replicas)")
        return secrets.token_bytes(_BYTES)


def _kept(path: Path, source: str) -> bytes:
    """The secret in ``path``, made first when there is none (atomically: a concurrent
    start reads the one that won)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(_BYTES))
            try:
                os.link(tmp, path)  # fails when another process made it meanwhile
            except FileExistsError:
                pass
        finally:
            tmp.unlink(missing_ok=True)
    data = path.read_bytes()
    if path.stat().st_mode & 0o077:  # kept by an operator, say: used, but said
        log.warning("secret_file_readable_by_others", path=str(path))
    if len(data) < _BYTES:
        raise ConfigError(source, "secret.file", f"{path} holds no secret ({len(data)} "
                          "bytes); remove it to make a new one")
    return data
