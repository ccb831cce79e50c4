"""Loopback port allocation for the co-located engine (and the test servers that reuse it)."""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now. The OS picks it (bind to port 0); another
    process may take it before the caller binds, so callers that can bind the socket
    themselves should keep it instead."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
