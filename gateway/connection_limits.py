"""A server's limits on its client connections: the ``[server]`` keys that set them
(:class:`ConnectionSettings`, each default explained), the limits a server runs under
(:class:`ConnectionLimits`), and the descriptor arithmetic behind ``max_connections = 0``.
Enforced by :mod:`gateway.connections`."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.schema import bounded

__all__ = ["MAX_AUTO_CONNECTIONS", "ConnectionLimits", "ConnectionSettings",
           "auto_max_connections"]

#: The most connections ``max_connections = 0`` allows, however high the descriptor limit
#: (each costs some 10 KiB of memory in the server, more in the kernel).
MAX_AUTO_CONNECTIONS = 16_384


@dataclass(frozen=True)
class ConnectionSettings:
    """``[server]``'s keys for the door's limits on client connections (part of
    :class:`~gateway.config.ServerConfig`), against clients that hold a connection, memory
    or an admission slot without using them."""

    #: An idle client connection is closed after this long (s) since its last response.
    #: Longer than the clients' and load balancers' own idle timeouts (httpx 5 s, aiohttp
    #: 15 s, AWS ALB 60 s), so the gateway never closes a connection a client is reusing at
    #: that moment. (A new connection's first request is bounded by header_timeout_s.)
    keep_alive_s: float = bounded(75.0, ge=0.05, le=3600)
    #: A request's line and headers together past this many bytes: 431 and the connection
    #: closed, nothing more buffered. Envoy's default is 60 KiB (max_request_headers_kb),
    #: nginx's 4 x 8 KiB buffers, Node.js' 16 KiB: 64 KiB leaves any real client room.
    max_header_bytes: int = bounded(65_536, ge=1024, le=16 * 1024 * 1024)
    #: A request's head (line and headers) must be whole this long (s) after its first
    #: byte, and a new connection's first one this long after it opened, else 408 and the
    #: connection closed: a client sending a byte every few seconds (slowloris) holds
    #: nothing for long. nginx's client_header_timeout is 60 s, Apache's RequestReadTimeout
    #: header=20-40; a program sends its head in one write, so 20 s is generous.
    header_timeout_s: float = bounded(20.0, ge=0.01, le=3600)
    #: At most this long (s) between two reads of a request body, else the connection is
    #: closed (the request ends as a client disconnect). nginx's client_body_timeout (also
    #: between reads) is 60 s, Apache's body=20: a live upload never pauses 30 s.
    body_timeout_s: float = bounded(30.0, ge=0.01, le=3600)
    #: A client that takes nothing of its response for this long (s) while the gateway has
    #: more to send (its socket's buffers full) is treated as gone: closed, its upstream
    #: request cancelled and its admission slot freed, as on a disconnect. nginx's
    #: send_timeout (also between writes) is 60 s; 30 s frees a held slot sooner.
    send_timeout_s: float = bounded(30.0, ge=0.01, le=3600)
    #: Open client connections at most; 0: half the process's open-file soft limit
    #: (RLIMIT_NOFILE), at most :data:`MAX_AUTO_CONNECTIONS`, leaving the rest for upstream
    #: connections (one per request in flight) and files. At the cap the longest idle
    #: connection is closed to make room (as nginx reuses its keep-alive ones); a new one
    #: is refused (503) only when none is idle.
    max_connections: int = bounded(0, ge=0)
    #: Open connections per client address; past it, a new one is refused (503). 0: no
    #: limit, the default, since behind a load balancer or a NAT every client shares one.
    max_connections_per_client: int = bounded(0, ge=0)


def auto_max_connections(soft_limit: int) -> int:
    """``max_connections = 0``: half the open-file soft limit (the other half for upstream
    connections, one per request in flight, and files), at most
    :data:`MAX_AUTO_CONNECTIONS`; ``soft_limit`` < 0: unlimited."""
    if soft_limit < 0:
        return MAX_AUTO_CONNECTIONS
    return max(1, min(MAX_AUTO_CONNECTIONS, soft_limit // 2))


def _soft_limit() -> int:
    """The process's open-file soft limit (RLIMIT_NOFILE); -1 when unlimited."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return -1 if soft == resource.RLIM_INFINITY else soft


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """A server's limits on its client connections (times in s, sizes in bytes; see
    :class:`ConnectionSettings` for each default and why). ``max_connections``
    and ``max_connections_per_client``: 0 is no limit here (the config's 0, "auto", is
    resolved by :meth:`of`)."""

    max_header_bytes: int = 65_536
    header_timeout_s: float = 20.0
    body_timeout_s: float = 30.0
    send_timeout_s: float = 30.0
    keep_alive_s: float = 75.0
    max_connections: int = 0
    max_connections_per_client: int = 0

    @classmethod
    def of(cls, server: ConnectionSettings,
           soft_limit: int | None = None) -> ConnectionLimits:
        """The limits ``server`` (``[server]``) configures, ``max_connections = 0`` resolved from
        ``soft_limit`` (default: the process's RLIMIT_NOFILE now)."""
        cap = server.max_connections
        if not cap:
            cap = auto_max_connections(_soft_limit() if soft_limit is None else soft_limit)
        return cls(server.max_header_bytes, server.header_timeout_s, server.body_timeout_s,
                   server.send_timeout_s, server.keep_alive_s, cap,
                   server.max_connections_per_client)

    def descriptor_warning(self, soft_limit: int | None = None) -> str | None:
        """A warning when ``max_connections`` leaves fewer than half the open-file soft
        limit for upstream connections and files (past it, new connections and upstream
        calls fail with EMFILE), else None."""
        soft = _soft_limit() if soft_limit is None else soft_limit
        if soft < 0 or self.max_connections <= soft // 2:
            return None
        return (f"server.max_connections = {self.max_connections} leaves "
                f"{max(0, soft - self.max_connections)} of the {soft} open files allowed "
                "(ulimit -n) for upstream connections and files; raise the limit or lower "
                "max_connections")
