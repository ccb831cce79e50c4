"""Run an ASGI app under uvicorn on a loopback port in a background thread (tests, benches)."""

from __future__ import annotations

import asyncio
import socket
import threading
from types import TracebackType
from typing import Self

import uvicorn

from gateway.connection_limits import ConnectionLimits, ConnectionSettings
from gateway.serving import server_protocol
from gateway.types import ASGIApp
from gateway.upstreams.ports import free_port

__all__ = ["ServerThread", "free_port"]


class ServerThread:
    """``with ServerThread(app) as srv: srv.url`` serves ``app`` until the block ends, with
    the protocol ``gateway serve`` runs, under ``limits`` (default: a gateway app's
    ``[server]`` settings, as ``gateway serve`` takes them; for any other app, the
    defaults)."""

    def __init__(self, app: ASGIApp, *, lifespan: str = "on", timeout_graceful_shutdown: int = 1,
                 limits: ConnectionLimits | None = None):
        # proto IPPROTO_TCP: asyncio sets TCP_NODELAY on accepted connections only then;
        # without it, responses written in pieces wait ~40 ms for a delayed ACK (Nagle).
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        if limits is None:
            gateway = getattr(app, "gateway", None)
            limits = ConnectionLimits.of(gateway.config.server if gateway is not None
                                         else ConnectionSettings())
        self.limits = limits
        config = uvicorn.Config(
            app,
            lifespan=lifespan,  # type: ignore[arg-type]
            log_level="warning",
            access_log=False,
            loop="asyncio",
            http=server_protocol(limits),  # as `gateway serve` runs
            timeout_graceful_shutdown=timeout_graceful_shutdown,
        )
        self.server = uvicorn.Server(config)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self.server.serve(sockets=[self.sock]))
        self.loop.close()

    def start(self) -> Self:
        self._thread.start()
        while not self.server.started:
            if not self._thread.is_alive():
                raise RuntimeError("server thread died during start-up")
            self._thread.join(0.005)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(10)
        self.sock.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
