"""OpenAI ``prompt_cache_key`` values that no tenant can make for another.

OpenAI routes a request to a prompt-cache machine by its prefix and ``prompt_cache_key``
(https://platform.openai.com/docs/guides/prompt-caching); tenants of the gateway share its
upstream key, hence its cache. A tenant that could send the key another tenant's requests
use would land on that tenant's machine and read, from ``cached_tokens``, whether a guessed
prompt is cached there. So every ``prompt_cache_key`` that goes upstream is an HMAC-SHA256
under the deployment's secret (:mod:`gateway.secret`) over the gateway key's id:

- **derived** (the prompt_cache stage sets one when the client sent none):
  ``gw-`` + 16 hex digits over the key id and the conversation's static prefix (tools,
  leading system messages) and opening message, :meth:`CacheKeys.derived`;
- **the client's own**, namespaced at the door before anything reads it:
  ``gwk-`` + 32 hex digits over the key id and the client's value (36 characters, within
  OpenAI's 64), :meth:`CacheKeys.client`. The same value from the same key is the same
  key upstream (a conversation keeps its cache machine); from another key it is another.

The two never collide (each message starts with its own label), and without the secret
neither can be computed from a key id and a prompt. A value that is not a string is left
for the upstream to refuse. Source: RFC 2104 (HMAC).
"""

from __future__ import annotations

import hmac
from typing import Any

import orjson

from gateway import jsonio
from gateway.context import RequestContext

__all__ = ["CLIENT_PREFIX", "DERIVED_PREFIX", "CacheKeys"]

DERIVED_PREFIX = "gw-"
CLIENT_PREFIX = "gwk-"


class CacheKeys:
    """``secret``: the deployment's (bytes, at least 32)."""

    __slots__ = ("_secret",)

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def _mac(self, label: bytes, key_id: str | None, payload: bytes) -> str:
        key = (key_id or "").encode()
        message = b"%s\0%d\0%s%s" % (label, len(key), key, payload)  # lengths: unambiguous
        return hmac.digest(self._secret, message, "sha256").hex()

    def derived(self, key_id: str | None, tools: Any, static: list[Any]) -> str:
        """The key of a request with ``tools`` and ``static`` (the leading system and
        developer messages, or Responses' instructions and items) from ``key_id``."""
        payload = orjson.dumps([tools, static])
        return DERIVED_PREFIX + self._mac(b"derived", key_id, payload)[:16]

    def client(self, key_id: str | None, value: str) -> str:
        """The client's own ``value`` as ``key_id``'s key upstream."""
        return CLIENT_PREFIX + self._mac(b"client", key_id, value.encode())[:32]

    def scope(self, ctx: RequestContext) -> None:
        """Namespace the client's ``prompt_cache_key`` in ``ctx.body`` (and ``ctx.raw``) by
        its gateway key; nothing when it sent none (or not a string)."""
        value = ctx.body.get("prompt_cache_key")
        if isinstance(value, str):
            body = {**ctx.body, "prompt_cache_key": self.client(ctx.key_id, value)}
            ctx.body, ctx.raw = body, jsonio.dumps(body)
