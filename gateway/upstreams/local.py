"""Upstream ``type = "local"``: the co-located torch engine, run as a child process.

The gateway starts ``python -m local_engine`` on a loopback port when it starts and stops it
when it stops; in between, the engine is an OpenAI-compatible upstream like any other (a
client disconnect closes the connection, which aborts the engine's request). A separate
process keeps model work off the gateway's event loop and its GIL. Requests that arrive
while the model is still loading wait for it (up to ``engine.start_timeout_ms``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import signal
import subprocess
import sys
import time

import aiohttp

from gateway.config import UpstreamConfig
from gateway.errors import UpstreamUnreachable
from gateway.testing.server import free_port
from gateway.upstreams.base import UpstreamRequest, UpstreamResponse
from gateway.upstreams.openai import OpenAIUpstream

__all__ = ["LocalUpstream"]

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: the engine gets SIGTERM if the gateway dies without stopping it."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class LocalUpstream(OpenAIUpstream):
    def __init__(self, name: str, config: UpstreamConfig):
        self.engine = config.engine
        self.port = self.engine.port or free_port()
        super().__init__(name, config)
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._process: asyncio.subprocess.Process | None = None
        self._ready = asyncio.Event()
        self._watch: asyncio.Task[None] | None = None

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def command(self) -> list[str]:
        e = self.engine
        cmd = [sys.executable, "-m", "local_engine", "--host", "127.0.0.1",
               "--port", str(self.port), "--model", e.model,
               "--kv-cache-mb", str(e.kv_cache_mb), "--max-num-seqs", str(e.max_num_seqs),
               "--max-batch-tokens", str(e.max_batch_tokens),
               "--max-model-len", str(e.max_model_len),
               "--default-max-tokens", str(e.default_max_tokens)]
        return cmd if e.embeddings else [*cmd, "--no-embeddings"]

    async def start(self) -> None:
        """Spawn the engine (its output goes to the gateway's stderr, keeping stdout for
        request log lines) and watch for it to answer /healthz."""
        self._process = await asyncio.create_subprocess_exec(
            *self.command(), stdin=subprocess.DEVNULL, stdout=sys.stderr.fileno(),
            preexec_fn=_die_with_parent)
        self._watch = asyncio.create_task(self._wait_healthy())

    async def _wait_healthy(self) -> None:
        url = self.base_url.removesuffix("/v1") + "/healthz"
        async with aiohttp.ClientSession() as session:
            while self._process is not None and self._process.returncode is None:
                with contextlib.suppress(aiohttp.ClientError, OSError):
                    async with session.get(url) as resp:
                        if resp.status == 200:
                            self._ready.set()
                            return
                await asyncio.sleep(0.1)

    async def _await_ready(self) -> None:
        if self._ready.is_set():
            return
        if self._process is None:
            raise UpstreamUnreachable(f"upstream {self.name!r}: the local engine is not "
                                      "started")
        deadline = time.monotonic() + self.engine.start_timeout_ms / 1000
        while not self._ready.is_set():
            if self._process.returncode is not None:
                raise UpstreamUnreachable(f"upstream {self.name!r}: the local engine exited "
                                          f"with status {self._process.returncode}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise UpstreamUnreachable(f"upstream {self.name!r}: the local engine is "
                                          "still loading")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready.wait(), min(left, 0.5))

    async def stream(self, request: UpstreamRequest) -> UpstreamResponse:
        await self._await_ready()
        return await super().stream(request)

    async def aclose(self) -> None:
        await super().aclose()
        if self._watch is not None:
            self._watch.cancel()
        process, self._process = self._process, None
        if process is not None and process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()
