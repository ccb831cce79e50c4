"""Admission under load, for ``bench/tail.py`` (issue 31): fairness between gateway keys and
interactive against batch priority, through an upstream admitted 4 at a time (50 ms each).

- :func:`fairness`: four keys, one with 10x the others' clients: each light key's goodput
  against its fair share, keys taking turns in the queue, beside all sending one key.
- :func:`priority`: interactive requests (``high``) alone and while 40 batch clients (``low``)
  fill the slots: the interactive p99 against its own unloaded p99, batch free to take every
  slot, and batch held to half of them.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from processes import free_port, start_gateway, stop, wait_ready

__all__ = ["fairness", "priority"]


TENANTS = {"heavy": 40, "light1": 4, "light2": 4, "light3": 4}  # closed-loop clients each
FAIR_POLICY = """version = "bench"
[admission]
max_concurrency = 4
max_queue = 1000
max_queue_wait_ms = 60000
"""
#: Every request: JSON, and the fake's 50 ms before it answers.
COMMON = {"content-type": "application/json", "x-fake-ttft-ms": "50"}


async def _ask_until(session: aiohttp.ClientSession, url: str, body: bytes,
                     headers: dict[str, str], deadline: float, took: list[float]) -> None:
    """One client asking back to back until ``deadline``; each answered request's latency
    (ms) into ``took``."""
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        async with session.post(url, data=body, headers=headers) as r:
            await r.read()
            if r.status == 200:
                took.append((time.perf_counter() - t0) * 1000)


#: The share of the slots batch requests may hold in :func:`priority`'s reserved run: the
#: other half is kept for the two interactive clients.
BATCH_SHARE = 0.5


async def priority(fake_port: int, tmp: Path, seconds: float) -> dict[str, Any]:
    """Interactive traffic (``x-gateway-priority: high``, 2 clients) through an upstream
    admitted 4 at a time (50 ms each), alone and while 40 batch clients (``low``) fill the
    rest: the interactive p99 against its unloaded p99, with batch requests free to hold
    every slot (queued behind interactive ones, never ahead) and with them holding at most
    ``BATCH_SHARE`` of the slots (``admission.low_priority_share``)."""
    body = orjson.dumps({"model": "bench-model", "max_tokens": 4,
                         "messages": [{"role": "user", "content": "now?"}]})
    out: dict[str, Any] = {"batch_share": BATCH_SHARE}
    for name, share in (("every slot", 1.0), ("reserved", BATCH_SHARE)):
        port = free_port()
        folder = tmp / f"priority-{share}"
        folder.mkdir()
        proc = start_gateway(port, fake_port, folder,
                             FAIR_POLICY + f"low_priority_share = {share}\n")
        run: dict[str, Any] = {}
        try:
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            await wait_ready(url, timeout=120, post={
                "model": "bench-model", "messages": [{"role": "user", "content": "up"}]})
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
                for loaded in (False, True):
                    took: list[float] = []
                    batch: list[float] = []
                    deadline = time.perf_counter() + seconds
                    await asyncio.gather(
                        *(_ask_until(s, url, body, {**COMMON, "x-gateway-priority": "high"},
                                     deadline, took) for _ in range(2)),
                        *(_ask_until(s, url, body, {**COMMON, "x-gateway-priority": "low"},
                                     deadline, batch) for _ in range(40 if loaded else 0)))
                    took.sort()
                    run["loaded" if loaded else "alone"] = {
                        "interactive_p99_ms": round(took[int(0.99 * len(took))], 1),
                        "interactive_requests": len(took), "batch_requests": len(batch)}
        finally:
            stop([proc])
        run["p99_over_alone"] = round(run["loaded"]["interactive_p99_ms"]
                                      / run["alone"]["interactive_p99_ms"], 3)
        out[name] = run
    out["p99_over_alone"] = out["reserved"]["p99_over_alone"]
    out["ok"] = out["p99_over_alone"] <= 2.0
    return out


async def fairness(fake_port: int, tmp: Path, seconds: float) -> dict[str, Any]:
    """Four gateway keys through an upstream admitted 4 at a time (50 ms each): one with 40
    clients asking back to back, three with 4 each. Each light key's goodput against its fair
    share (a quarter of the throughput), with keys taking turns in the queue (each its own
    key) and without (all four sending one key: first come, first served)."""
    out: dict[str, Any] = {"clients": TENANTS, "slots": 4, "service_ms": 50}
    body = orjson.dumps({"model": "bench-model", "max_tokens": 4,
                         "messages": [{"role": "user", "content": "fair?"}]})
    keys = "".join(f'[[auth.keys]]\nid = "{t}"\nkey_env = "BENCH_KEY_{t.upper()}"\n'
                   for t in TENANTS)
    for tenant in TENANTS:
        os.environ[f"BENCH_KEY_{tenant.upper()}"] = f"key-{tenant}"
    for name, own_keys in (("per key", True), ("one key", False)):
        port = free_port()
        folder = tmp / f"fair-{name.replace(' ', '-')}"
        folder.mkdir()
        proc = start_gateway(port, fake_port, folder, FAIR_POLICY, config_extra=keys)
        served: dict[str, list[float]] = {t: [] for t in TENANTS}
        try:
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            await wait_ready(url, timeout=120, post={
                "model": "bench-model", "messages": [{"role": "user", "content": "up"}]},
                headers={"authorization": "Bearer key-heavy"})
            deadline = time.perf_counter() + seconds
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
                await asyncio.gather(*(
                    _ask_until(s, url, body, {**COMMON, "authorization": "Bearer key-"
                                              + (t if own_keys else "heavy")},
                               deadline, served[t])
                    for t, n in TENANTS.items() for _ in range(n)))
        finally:
            stop([proc])
        total = sum(map(len, served.values()))
        out[name] = {t: {"goodput_rps": round(len(v) / seconds, 1),
                         "of_fair_share": round(len(v) / (total / len(TENANTS)), 3)}
                     for t, v in served.items()}
    worst = min(out["per key"][t]["of_fair_share"] for t in TENANTS if t != "heavy")
    out["light_worst_of_fair_share"] = worst
    out["ok"] = worst >= 0.9
    return out
