"""Gateway keys: who may call, and the key id that logs and metrics show instead of the key."""

from __future__ import annotations

import hashlib
import os

from gateway.config import AuthConfig
from gateway.errors import AuthenticationFailed, ConfigError

__all__ = ["Authenticator"]


class Authenticator:
    """Checks ``Authorization: Bearer KEY`` (or ``x-api-key: KEY``) against configured keys.

    Keys are held only as SHA-256 digests. With no keys configured, every request passes and
    ``check`` returns None.
    """

    def __init__(self, config: AuthConfig, source: str = "config"):
        self._by_digest: dict[bytes, str] = {}
        #: Key id -> the beta features it may send upstream (its ``betas``; keys without
        #: one are absent: any).
        self.betas = {key.id: frozenset(key.betas) for key in config.keys
                      if key.betas is not None}
        for key in config.keys:
            if key.key_env is not None:
                secret = os.environ.get(key.key_env)
                if not secret:
                    raise ConfigError(source, f"auth.keys[{key.id}].key_env",
                                      f"environment variable {key.key_env} is not set")
                digest = hashlib.sha256(secret.encode()).digest()
            else:
                assert key.sha256 is not None
                try:
                    digest = bytes.fromhex(key.sha256)
                except ValueError as exc:
                    raise ConfigError(source, f"auth.keys[{key.id}].sha256",
                                      "expected 64 hex digits") from exc
            self._by_digest[digest] = key.id

    @property
    def required(self) -> bool:
        return bool(self._by_digest)

    def check(self, headers: list[tuple[bytes, bytes]]) -> str | None:
        """The caller's key id; raises AuthenticationFailed (401) when keys are configured
        and the request carries none or a wrong one."""
        if not self._by_digest:
            return None
        secret: bytes | None = None
        for k, v in headers:
            if k == b"authorization" and v[:7].lower() == b"bearer ":
                secret = v[7:].strip()
            elif k == b"x-api-key" and secret is None:
                secret = v.strip()
        if not secret:
            raise AuthenticationFailed("missing API key: send 'Authorization: Bearer <key>'")
        key_id = self._by_digest.get(hashlib.sha256(secret).digest())
        if key_id is None:
            raise AuthenticationFailed("incorrect API key provided")
        return key_id
