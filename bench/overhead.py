"""What the gateway adds: the same workload sent directly to the fake upstream and through the
gateway, side by side in one run.

Three processes on this machine: the fake OpenAI upstream (zero think time unless
``--ttft-ms``/``--itl-ms``), the gateway (``gateway serve``, request log on, to /dev/null),
and this load generator (aiohttp, closed loop at a fixed concurrency). Each measurement
alternates short direct and gateway rounds so that drift in the machine's speed (a shared
VM) hits both sides alike. For each of non-streaming and streaming at concurrency 1 and 32,
it prints latency p50/p99 (ms) direct
and through the gateway, the added latency, added TTFT (streaming: time to the first event)
and throughput gateway/direct.

    python bench/overhead.py [--requests 2000] [--concurrency 1 32] [--rounds 5]

Prints a JSON document, then one summary line.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import uvloop
from processes import free_port, start_fake, start_gateway, wait_ready

BODY = {"model": "bench-model", "messages": [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Summarise the plot of Hamlet in two sentences."}],
    "max_tokens": 64}


async def run_load(session: aiohttp.ClientSession, url: str, stream: bool, concurrency: int,
                   requests: int, headers: dict[str, str]) -> Load:
    body = orjson.dumps({**BODY, "stream": stream})
    hdrs = {"content-type": "application/json", **headers}
    load = Load()
    remaining = requests

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            t0 = time.perf_counter()
            try:
                async with session.post(url, data=body, headers=hdrs) as r:
                    if stream:
                        first = True
                        async for _ in r.content.iter_any():
                            if first:
                                load.ttfts.append(time.perf_counter() - t0)
                                first = False
                    else:
                        await r.read()
                    if r.status != 200:
                        load.errors += 1
            except aiohttp.ClientError:
                load.errors += 1
            load.latencies.append(time.perf_counter() - t0)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    load.elapsed = time.perf_counter() - started
    return load


class Load:
    """Latencies (s) of one or more runs, pooled."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.ttfts: list[float] = []
        self.errors = 0
        self.elapsed = 0.0

    def add(self, other: Load) -> None:
        self.latencies += other.latencies
        self.ttfts += other.ttfts
        self.errors += other.errors
        self.elapsed += other.elapsed

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.elapsed

    def summary(self) -> dict[str, Any]:
        return {"requests": len(self.latencies), "p50_ms": pct(self.latencies, 50),
                "p99_ms": pct(self.latencies, 99),
                "ttft_p50_ms": pct(self.ttfts, 50) if self.ttfts else None,
                "ttft_p99_ms": pct(self.ttfts, 99) if self.ttfts else None,
                "rps": round(self.rps, 1), "errors": self.errors}


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))
    return round(ordered[k] * 1000, 3)


async def bench(args: argparse.Namespace, fake_url: str, gw_url: str) -> dict[str, Any]:
    headers = {"x-fake-tokens": str(args.tokens)}
    if args.ttft_ms:
        headers["x-fake-ttft-ms"] = str(args.ttft_ms)
    if args.itl_ms:
        headers["x-fake-itl-ms"] = str(args.itl_ms)
    results: dict[str, Any] = {}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        for stream in (False, True):
            for conc in args.concurrency:
                n = args.requests if conc == 1 else args.requests * 2
                name = f"{'stream' if stream else 'unary'}_c{conc}"
                # warm both paths (connections, code caches) before measuring
                for url in (fake_url, gw_url):
                    await run_load(session, url, stream, conc, max(50, conc * 4), headers)
                # Short interleaved rounds, so drift in the machine's speed hits both sides.
                direct, via, ratios = Load(), Load(), []
                for r in range(args.rounds):
                    order = [(direct, fake_url), (via, gw_url)]
                    runs = {}
                    for load, url in order if r % 2 == 0 else order[::-1]:
                        runs[url] = await run_load(session, url, stream, conc,
                                                   n // args.rounds, headers)
                        load.add(runs[url])
                    ratios.append(runs[gw_url].rps / runs[fake_url].rps)
                d, g = direct.summary(), via.summary()
                row: dict[str, Any] = {"direct": d, "gateway": g,
                                       "added_p50_ms": round(g["p50_ms"] - d["p50_ms"], 3),
                                       "added_p99_ms": round(g["p99_ms"] - d["p99_ms"], 3),
                                       "throughput_ratio": round(via.rps / direct.rps, 3),
                                       "throughput_ratio_per_round": [round(x, 3)
                                                                      for x in ratios]}
                if stream:
                    row["added_ttft_p50_ms"] = round(g["ttft_p50_ms"] - d["ttft_p50_ms"], 3)
                    row["added_ttft_p99_ms"] = round(g["ttft_p99_ms"] - d["ttft_p99_ms"], 3)
                results[name] = row
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000,
                        help="requests per measurement at concurrency 1 (x2 above)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--rounds", type=int, default=5,
                        help="interleaved direct/gateway rounds per measurement")
    parser.add_argument("--tokens", type=int, default=16, help="content chunks per response")
    parser.add_argument("--ttft-ms", type=float, default=0)
    parser.add_argument("--itl-ms", type=float, default=0)
    args = parser.parse_args()
    fake_port, gw_port = free_port(), free_port()
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            procs.append(start_fake(fake_port))
            procs.append(start_gateway(gw_port, fake_port, Path(tmp), 'version = "bench"\n'))
            fake_url = f"http://127.0.0.1:{fake_port}/v1/chat/completions"
            gw_url = f"http://127.0.0.1:{gw_port}/v1/chat/completions"

            async def go() -> dict[str, Any]:
                await wait_ready(f"http://127.0.0.1:{fake_port}/v1/models")
                await wait_ready(f"http://127.0.0.1:{gw_port}/healthz")
                return await bench(args, fake_url, gw_url)

            results = uvloop.run(go())
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(10)
    doc = {"bench": "overhead", "cpus": os.cpu_count(), "tokens_per_response": args.tokens,
           "upstream_ttft_ms": args.ttft_ms, "upstream_itl_ms": args.itl_ms, "results": results}
    print(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())
    u1, u32 = results.get("unary_c1"), results.get("unary_c32")
    s1 = results.get("stream_c1")
    parts = []
    if u1:
        parts.append(f"c1 unary added p50 {u1['added_p50_ms']} ms p99 {u1['added_p99_ms']} ms")
    if s1:
        parts.append(f"c1 stream added TTFT p50 {s1['added_ttft_p50_ms']} ms")
    if u32:
        parts.append(f"c32 unary added p99 {u32['added_p99_ms']} ms, "
                     f"throughput {u32['throughput_ratio']:.0%} of direct")
    print("overhead: " + "; ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
