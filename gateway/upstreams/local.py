"""Upstream ``type = "local"``: the co-located torch engine, run as a child process.

The gateway starts ``python -m local_engine`` on a loopback port when it starts and stops it
when it stops; in between, the engine is an OpenAI-compatible upstream like any other (a
client disconnect closes the connection, which aborts the engine's request). A separate
process keeps model work off the gateway's event loop and its GIL. Requests that arrive
while the model is still loading wait for it (up to ``engine.start_timeout_ms``).

If the engine dies after it has served (a crash, the OOM killer), the gateway starts it
again, after 0.5 s doubling to 30 s while it keeps dying; requests wait for the restart as
they wait for a first start, and a request whose connection found the engine dead is sent
again once it is back (the dead engine kept nothing of it). An engine that dies before it
ever answers /healthz fails requests at once, naming its exit status, until a restart
succeeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import aiohttp
import structlog

from gateway.config import UpstreamConfig
from gateway.errors import UpstreamUnreachable
from gateway.service_time import ServiceRates
from gateway.upstreams.base import UpstreamRequest, UpstreamResponse
from gateway.upstreams.openai import OpenAIUpstream
from gateway.upstreams.ports import free_port

__all__ = ["LocalUpstream"]

_PR_SET_PDEATHSIG = 1
RESTART_DELAY_S = (0.5, 30.0)  # first and longest wait before restarting a dead engine
STEADY_S = 60.0  # an engine up this long counts as healthy again: the wait starts over

log = structlog.get_logger("gateway.upstreams.local")


def _prepare_child(nice: int) -> None:  # pragma: no cover - runs in the child before exec
    """The engine at CPU priority ``nice`` (relative to the gateway) and, on Linux, sent
    SIGTERM if the gateway dies without stopping it."""
    with contextlib.suppress(OSError):
        os.nice(nice)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class LocalUpstream(OpenAIUpstream):
    provider = "local_engine"  # gen_ai.provider.name in traces
    continues_final_message = True  # local_engine.openai_format: continue_final_message

    def __init__(self, name: str, config: UpstreamConfig):
        self.engine = config.engine
        self.port = self.engine.port or free_port()
        self.capacity = self.engine.max_num_seqs
        super().__init__(name, config)
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._process: asyncio.subprocess.Process | None = None
        self._ready = asyncio.Event()
        self._start_failed: int | None = None  # exit status of an engine that never came up
        self._supervisor: asyncio.Task[None] | None = None
        self._capacity_changed: list[Callable[[int | None, ServiceRates | None], None]] = []
        #: Set when the gateway traces (gateway.tracing.Tracing.engine_env): the engine
        #: traces too (``--tracing``), exporting with this environment.
        self.trace_env: dict[str, str] | None = None

    @property
    def ready(self) -> bool:
        process = self._process
        return self._ready.is_set() and process is not None and process.returncode is None

    def command(self) -> list[str]:
        e = self.engine
        cmd = [sys.executable, "-m", "local_engine", "--host", "127.0.0.1",
               "--port", str(self.port), "--model", e.model,
               "--kv-cache-mb", str(e.kv_cache_mb), "--max-num-seqs", str(e.max_num_seqs),
               "--max-batch-tokens", str(e.max_batch_tokens),
               "--max-model-len", str(e.max_model_len),
               "--default-max-tokens", str(e.default_max_tokens),
               "--max-step-slowdown", str(e.max_step_slowdown), "--dtype", e.dtype,
               "--quantization", e.quantization, "--kv-cache-dtype", e.kv_cache_dtype]
        if not e.cuda_graphs:
            cmd.append("--no-cuda-graphs")
        spec = e.speculative
        cmd += ["--speculative", "off" if spec.method == "off"
                else json.dumps(dataclasses.asdict(spec))]
        if self.trace_env is not None:
            cmd.append("--tracing")
        return cmd if e.embeddings else [*cmd, "--no-embeddings"]

    async def start(self) -> None:
        """Spawn the engine (its output goes to the gateway's stderr, keeping stdout for
        request log lines) and supervise it: ready once it answers /healthz, restarted when
        it dies."""
        process = await self._spawn()
        self._supervisor = asyncio.create_task(self._supervise(process))

    async def _spawn(self) -> asyncio.subprocess.Process:
        self._process = await asyncio.create_subprocess_exec(
            *self.command(), stdin=subprocess.DEVNULL, stdout=sys.stderr.fileno(),
            env=None if self.trace_env is None else {**os.environ, **self.trace_env},
            preexec_fn=functools.partial(_prepare_child, self.engine.nice))
        return self._process

    async def _supervise(self, process: asyncio.subprocess.Process) -> None:
        delay = RESTART_DELAY_S[0]
        while True:
            came_up = await self._wait_healthy(process)
            up_since = time.monotonic()
            status = await process.wait()
            self._ready.clear()
            self._start_failed = None if came_up else status
            if came_up and time.monotonic() - up_since >= STEADY_S:
                delay = RESTART_DELAY_S[0]
            log.warning("local_engine_exited", upstream=self.name, status=status,
                        while_starting=not came_up, restart_in_s=delay)
            await asyncio.sleep(delay)
            delay = min(2 * delay, RESTART_DELAY_S[1])
            process = await self._spawn()

    async def _wait_healthy(self, process: asyncio.subprocess.Process) -> bool:
        """Poll /healthz until the engine answers (True, and ready) or exits (False)."""
        url = self.base_url.removesuffix("/v1") + "/healthz"
        async with aiohttp.ClientSession() as session:
            while process.returncode is None:
                with contextlib.suppress(aiohttp.ClientError, OSError):
                    async with session.get(url) as resp:
                        if resp.status == 200:
                            self._take_capacity(await resp.read())
                            self._start_failed = None
                            self._ready.set()
                            return True
                await asyncio.sleep(0.1)
        return False

    def on_capacity(self, changed: Callable[[int | None, ServiceRates | None], None]) -> None:
        self._capacity_changed.append(changed)

    def _take_capacity(self, health: bytes) -> None:
        """The engine's latency-bounded batch, from its /healthz (local_engine.calibrate):
        what admission lets in at once, never more than max_num_seqs; and its measured
        rates, from which admission predicts service times (gateway.service_time)."""
        with contextlib.suppress(ValueError):
            body = json.loads(health)
            capacity = body.get("capacity") if isinstance(body, dict) else None
            if isinstance(capacity, int) and capacity >= 1:
                self.capacity = min(capacity, self.engine.max_num_seqs)
                rates = ServiceRates.from_health(body.get("rates"),
                                                 self.engine.default_max_tokens)
                for changed in self._capacity_changed:
                    changed(self.capacity, rates)
                log.info("local_engine_capacity", upstream=self.name, capacity=self.capacity,
                         max_num_seqs=self.engine.max_num_seqs, dtype=body.get("dtype"),
                         rates=rates)

    async def _await_ready(self) -> None:
        if self._ready.is_set():
            return
        if self._process is None:
            raise UpstreamUnreachable(f"upstream {self.name!r}: the local engine is not "
                                      "started")
        deadline = time.monotonic() + self.engine.start_timeout_ms / 1000
        while not self._ready.is_set():
            if self._start_failed is not None:
                raise UpstreamUnreachable(f"upstream {self.name!r}: the local engine exited "
                                          f"with status {self._start_failed} while starting")
            left = deadline - time.monotonic()
            if left <= 0:
                raise UpstreamUnreachable(f"upstream {self.name!r}: the local engine is "
                                          "still loading")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready.wait(), min(left, 0.5))

    async def _died(self, process: asyncio.subprocess.Process) -> bool:
        """Whether the engine process has exited (waits up to 0.5 s for the exit to be
        reaped: a refused connection may come a moment before it)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(process.wait(), 0.5)
        return process.returncode is not None

    async def stream(self, request: UpstreamRequest) -> UpstreamResponse:
        await self._await_ready()
        process = self._process
        try:
            return await super().stream(request)
        except UpstreamUnreachable:
            if process is None or not await self._died(process):
                raise
            self._ready.clear()  # the supervisor does too, and restarts it
        log.warning("local_engine_request_resent", upstream=self.name,
                    request_id=request.request_id)
        await self._await_ready()
        return await super().stream(request)

    async def aclose(self) -> None:
        await super().aclose()
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        process, self._process = self._process, None
        if process is not None and process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()
