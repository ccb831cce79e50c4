"""A server's limits on its client connections (:class:`ConnectionLimits`), resolved from
``[server]`` (:class:`~gateway.config.ServerConfig`, where each default is explained), and
the descriptor arithmetic behind ``max_connections = 0``. Enforced by
:mod:`gateway.connections`."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.config import ServerConfig

__all__ = ["MAX_AUTO_CONNECTIONS", "ConnectionLimits", "auto_max_connections"]

#: The most connections ``max_connections = 0`` allows, however high the descriptor limit
#: (each costs some 10 KiB of memory in the server, more in the kernel).
MAX_AUTO_CONNECTIONS = 16_384


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
    :class:`~gateway.config.ServerConfig` for each default and why). ``max_connections``
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
    def of(cls, server: ServerConfig, soft_limit: int | None = None) -> ConnectionLimits:
        """The limits ``server`` configures, ``max_connections = 0`` resolved from
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
