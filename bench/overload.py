"""Overload: the gateway with admission control on and off, side by side, in one run.

A fake upstream with a fixed capacity C (C requests served at once, each taking
``--latency-ms``; more wait in its queue, like a saturated model server) sits behind a
gateway. An open-loop Poisson load offers 0.5x, then 3x, then 0.5x the upstream's capacity
(C / latency requests per second). Each run gets a fresh upstream and gateway; the run with
admission on uses a static limit of C per upstream and a short queue.

Reported per run: goodput at 3x (successful responses per second, and as a share of
capacity; goodput counts only answers within the SLO, 2x the unloaded p99), admitted-request
p50/p99 (ms) against the unloaded p99, shed-response p99 (ms),
client timeouts, connection errors, and recovery time after the load drops (s: from the drop
until every request that starts later finishes within 1.5x the unloaded p99).

    python bench/overload.py [--capacity 8] [--latency-ms 100] [--phase-s 4 6 6]

Prints a JSON document, then one summary line.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import uvloop
from processes import free_port, start_fake, start_gateway, wait_ready

BODY = orjson.dumps({"model": "bench-model", "max_tokens": 16,
                     "messages": [{"role": "user", "content": "Name three rivers."}]})


@dataclass
class Result:
    started: float  # s since the run began
    latency: float  # s
    status: int  # HTTP status, 0 for a client timeout, -1 for a connection error


def _policy(admission: bool, capacity: int, queue_wait_ms: float) -> str:
    return f"""
version = "overload-{'on' if admission else 'off'}"
[retry]
max_attempts = 1
[admission]
enabled = {'true' if admission else 'false'}
max_concurrency = {capacity}
max_queue = {capacity * 4}
max_queue_wait_ms = {queue_wait_ms}
[breaker]
enabled = false
"""


async def offer(url: str, phases: list[tuple[float, float]], latency_ms: float,
                timeout_s: float, seed: int) -> list[Result]:
    """Open-loop Poisson arrivals: ``phases`` is [(rate per s, seconds)]."""
    rng = random.Random(seed)
    results: list[Result] = []
    headers = {"content-type": "application/json", "x-fake-ttft-ms": str(latency_ms)}
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    connector = aiohttp.TCPConnector(limit=0)
    tasks: set[asyncio.Task[None]] = set()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        t0 = time.perf_counter()

        async def one(started: float) -> None:
            status = -1
            try:
                async with session.post(url, data=BODY, headers=headers) as r:
                    await r.read()
                    status = r.status
            except TimeoutError:
                status = 0
            except aiohttp.ClientError:
                status = -1
            results.append(Result(started, time.perf_counter() - t0 - started, status))

        next_at = 0.0
        phase_end = 0.0
        for rate, seconds in phases:
            phase_end += seconds
            while True:
                next_at += rng.expovariate(rate)
                if next_at >= phase_end:
                    next_at = phase_end
                    break
                delay = next_at - (time.perf_counter() - t0)
                if delay > 0:
                    await asyncio.sleep(delay)
                task = asyncio.create_task(one(next_at))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(tasks)
    return results


def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))
    return round(ordered[k] * 1000, 2)


def summarise(results: list[Result], phases: list[tuple[float, float]], capacity_rps: float,
              unloaded_p99_ms: float | None) -> dict[str, Any]:
    low_end, high_end = phases[0][1], phases[0][1] + phases[1][1]
    base = [r.latency for r in results if r.started < low_end and r.status == 200]
    unloaded = unloaded_p99_ms if unloaded_p99_ms is not None else pct(base, 99)
    slo_s = 2 * (unloaded or 0) / 1000
    high = [r for r in results if low_end <= r.started < high_end]
    # Completed successfully during the 3x window; goodput counts those within the SLO.
    done_high = [r for r in results if r.status == 200
                 and low_end <= r.started + r.latency < high_end]
    good_high = [r for r in done_high if r.latency <= slo_s]
    shed = [r.latency for r in results if r.status in (429, 503)]
    admitted = [r.latency for r in high if r.status == 200]
    # Recovery: the earliest time after the drop from which every request ends in time.
    limit_s = 1.5 * (unloaded or 0) / 1000
    after = sorted((r for r in results if r.started >= high_end), key=lambda r: r.started)
    recovery: float | None = 0.0
    for i in range(len(after) - 1, -1, -1):
        r = after[i]
        if r.status not in (200, 429, 503) or r.latency > limit_s:
            recovery = after[i + 1].started - high_end if i + 1 < len(after) else None
            break
    goodput = len(good_high) / phases[1][1]
    return {
        "requests": len(results),
        "unloaded_p99_ms": unloaded,
        "slo_ms": round(slo_s * 1000, 2),
        "throughput_rps_at_3x": round(len(done_high) / phases[1][1], 1),
        "goodput_rps_at_3x": round(goodput, 1),
        "goodput_share_of_capacity": round(goodput / capacity_rps, 3),
        "admitted_p50_ms_at_3x": pct(admitted, 50),
        "admitted_p99_ms_at_3x": pct(admitted, 99),
        "admitted_p99_over_unloaded": round(pct(admitted, 99) / unloaded, 2)
        if admitted and unloaded else None,
        "shed_responses": len(shed),
        "shed_p99_ms": pct(shed, 99),
        "client_timeouts": sum(r.status == 0 for r in results),
        "connection_errors": sum(r.status == -1 for r in results),
        "other_errors": sum(r.status not in (0, -1, 200, 429, 503) for r in results),
        "recovered": recovery is not None,
        "recovery_s": None if recovery is None else round(recovery, 2),
    }


async def one_run(args: argparse.Namespace, admission: bool, workdir: Path,
                  unloaded_p99_ms: float | None) -> dict[str, Any]:
    fake_port, gw_port = free_port(), free_port()
    procs = [start_fake(fake_port, args.capacity)]
    procs.append(start_gateway(gw_port, fake_port, workdir,
                               _policy(admission, args.capacity, args.queue_wait_ms),
                               "read_timeout_ms = 600000\nmax_connections = 4096"))
    try:
        await wait_ready(f"http://127.0.0.1:{gw_port}/healthz")
        await wait_ready(f"http://127.0.0.1:{fake_port}/v1/models")
        capacity_rps = args.capacity / (args.latency_ms / 1000)
        low, high, back = args.phase_s
        phases = [(0.5 * capacity_rps, low), (3 * capacity_rps, high), (0.5 * capacity_rps, back)]
        results = await offer(f"http://127.0.0.1:{gw_port}/v1/chat/completions", phases,
                              args.latency_ms, args.client_timeout_s, args.seed)
        out = summarise(results, phases, capacity_rps, unloaded_p99_ms)
        out["admission"] = admission
        return out
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--capacity", type=int, default=8, help="upstream slots (C)")
    parser.add_argument("--latency-ms", type=float, default=100, help="upstream time per request")
    parser.add_argument("--phase-s", type=float, nargs=3, default=[4, 6, 6],
                        help="seconds at 0.5x, 3x, 0.5x capacity")
    parser.add_argument("--queue-wait-ms", type=float, default=50,
                        help="admission: longest queue wait before shedding")
    parser.add_argument("--client-timeout-s", type=float, default=5)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        on = uvloop.run(one_run(args, True, Path(tmp), None))
        off = uvloop.run(one_run(args, False, Path(tmp), on["unloaded_p99_ms"]))
    doc = {"bench": "overload", "cpus": os.cpu_count(), "capacity": args.capacity,
           "upstream_latency_ms": args.latency_ms,
           "capacity_rps": args.capacity / (args.latency_ms / 1000),
           "phases_s": args.phase_s, "client_timeout_s": args.client_timeout_s,
           "admission_on": on, "admission_off": off}
    print(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())
    print(f"overload at 3x: admission on: goodput {on['goodput_share_of_capacity']:.0%} of C, "
          f"admitted p99 {on['admitted_p99_ms_at_3x']} ms ({on['admitted_p99_over_unloaded']}x "
          f"unloaded), shed p99 {on['shed_p99_ms']} ms, timeouts {on['client_timeouts']}, "
          f"conn errors {on['connection_errors']}, recovery {on['recovery_s']} s | "
          f"off: goodput {off['goodput_share_of_capacity']:.0%}, admitted p99 "
          f"{off['admitted_p99_ms_at_3x']} ms, timeouts {off['client_timeouts']}, "
          f"conn errors {off['connection_errors']}, "
          + (f"recovery {off['recovery_s']} s" if off["recovered"] else
             f"not recovered {args.phase_s[2]} s after the drop"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
