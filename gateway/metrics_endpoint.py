"""``GET /metrics``: the Prometheus exposition, open, behind a bearer token, and on the main
port or a listener of its own.

- ``server.metrics_key_env``: the environment variable holding a token; /metrics then
  answers only ``Authorization: Bearer <token>`` (401 otherwise), as Prometheus sends it
  with ``authorization: {credentials_file: ...}`` in its scrape config.
- ``server.metrics_port``: /metrics is served on that port alone (a uvicorn HTTP/1.1
  listener the app's lifespan starts and stops) and no longer on the main one, so that it
  can stay inside the cluster while the API is exposed.

Neither set (the default, and ``make run``'s): open on the main port. What it shows is
aggregate counts whose labels come from fixed sets (gateway.metric_labels): no key, id or
path; a public deployment should still set one of the two.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
from collections.abc import Awaitable, Callable

import uvicorn

from gateway.config import Config
from gateway.errors import AuthenticationFailed, ConfigError, NotFound
from gateway.http import send_bytes, send_error
from gateway.types import ASGIApp, Receive, Scope, Send

__all__ = ["MetricsApp", "MetricsListener", "metrics_token"]

_TEXT = (b"content-type", b"text/plain; version=0.0.4; charset=utf-8")


def metrics_token(config: Config) -> bytes | None:
    """The SHA-256 of the token ``server.metrics_key_env`` names, or None when unset.
    Raises ConfigError when the variable is named but empty or absent."""
    env = config.server.metrics_key_env
    if env is None:
        return None
    token = os.environ.get(env)
    if not token:
        raise ConfigError(config.path, "server.metrics_key_env",
                          f"environment variable {env} is not set")
    return hashlib.sha256(token.encode()).digest()


class MetricsApp:
    """ASGI app answering ``GET /metrics`` with ``render()``'s bytes, when ``token``
    (a SHA-256, :func:`metrics_token`) is None or the request's bearer token hashes to it;
    any other path 404, any other method 405, both in OpenAI's error format."""

    def __init__(self, render: Callable[[], Awaitable[bytes]], token: bytes | None) -> None:
        self.render = render
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"].rstrip("/") != "/metrics":
            await send_error(send, NotFound(f"no route for {scope['method']} "
                                            f"{scope['path'][:256]}"))
            return
        if scope["method"] not in ("GET", "HEAD"):
            await send_bytes(send, 405, b'{"error": {"message": "Method Not Allowed", '
                             b'"type": "invalid_request_error", "param": null, '
                             b'"code": "method_not_allowed"}}',
                             [(b"content-type", b"application/json"), (b"allow", b"GET")])
            return
        if self.token is not None and not self._authorized(scope["headers"]):
            error = AuthenticationFailed("/metrics needs 'Authorization: Bearer <token>'")
            await send_error(send, error, [(b"www-authenticate", b'Bearer realm="metrics"')])
            return
        await send_bytes(send, 200, await self.render(), [_TEXT])

    def _authorized(self, headers: list[tuple[bytes, bytes]]) -> bool:
        assert self.token is not None
        for k, v in headers:
            if k == b"authorization" and v[:7].lower() == b"bearer ":
                digest = hashlib.sha256(v[7:].strip()).digest()
                return hmac.compare_digest(digest, self.token)
        return False


class MetricsListener:
    """``app`` served on ``host:port`` (port 0: a free one, then :attr:`port`) by uvicorn's
    h11 protocol, from :meth:`start` to :meth:`aclose`, on the running event loop.
    :meth:`start` raises OSError when the address cannot be bound."""

    def __init__(self, app: ASGIApp, host: str, port: int) -> None:
        self.app, self.host, self.port = app, host, port
        self._server: uvicorn.Server | None = None
        self._sock: socket.socket | None = None

    async def start(self) -> None:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.create_server((self.host, self.port), family=family)
        self.port = int(sock.getsockname()[1])
        # Bounded like a scrape needs: small heads, a few connections, short keep-alive.
        config = uvicorn.Config(self.app, lifespan="off", http="h11", access_log=False,
                                log_level="warning", timeout_keep_alive=5,
                                limit_concurrency=16, timeout_graceful_shutdown=1,
                                h11_max_incomplete_event_size=16 * 1024)
        config.load()
        server = uvicorn.Server(config)
        server.lifespan = config.lifespan_class(config)
        self._server, self._sock = server, sock
        await server.startup(sockets=[sock])

    async def aclose(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.shutdown(sockets=[self._sock] if self._sock else None)
