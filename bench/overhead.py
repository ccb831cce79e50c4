"""What the gateway adds: the same workload sent directly to the fake upstream, through the
floor (a bare aiohttp reverse proxy) and through the gateway, side by side in one run.

Four processes on this machine: the fake OpenAI upstream (zero think time unless
``--ttft-ms``/``--itl-ms``), the floor (``floor_proxy.py``: the least any Python proxy pays,
forwarding and streaming bytes back, nothing else), the gateway (``gateway serve``, request
log on, to /dev/null), and this load generator (aiohttp, closed loop at a fixed
concurrency). Each measurement runs short rounds of direct, floor and gateway, rotating the
order every round so that drift in the machine's speed (a shared VM) hits all three alike.
For each of non-streaming and streaming at concurrency 1 and 32 it prints, for the floor and
the gateway, latency p50/p99 (ms), the latency added over direct, added TTFT (streaming:
time to the first event) and throughput over direct (pooled, per round, and the median of
the rounds). The checks below read the added p50s as the rounds' medians, and throughput
pooled: all requests over all the time of the interleaved rounds, so the direct run, the
same denominator for both proxies, cancels. (Per round, the direct run's own rate moves by
up to 2x on this VM, with where the kernel places the processes: a ratio over one round's
direct run, or a median of such ratios, carries that noise; the pooled ratio does not.)

The same again for Anthropic's Messages API (``--apis``): the fake Anthropic upstream
(``gateway.testing.fake_anthropic``), a second floor in front of it, and the same gateway's
``/v1/messages`` to a ``type = "anthropic"`` upstream (native: nothing translated).

Then the acceptance checks of issue 12 (Chat Completions), each with its numbers and a
boolean:

- c=1, unary and stream: gateway added p50 - floor added p50 <= 0.1 ms;
- c=32, unary and stream: (gateway/direct throughput) >= 0.9 x (floor/direct throughput);
- c=32, unary and stream: gateway added p99 <= 1.5 x floor added p99 + 2 ms;

and of issue 13: ``/v1/messages`` adds no more than ``/v1/chat/completions``, each measured
over its own floor (so the fakes' own costs cancel):

- c=1, unary and stream: its excess over the floor (added p50) <= chat's excess + 0.1 ms;
- c=32, unary and stream: its throughput over the floor >= 0.95 x chat's (the 5% is this
  VM's run-to-run noise on a ratio of ratios).

    python bench/overhead.py [--requests 2000] [--concurrency 1 32] [--rounds 10]
                             [--apis openai anthropic]

Prints a JSON document (``results`` per measurement, ``acceptance`` per check), then one
summary line starting ``overhead:``.

``--instructions`` measures instead the instructions the gateway process executes per
request (callgrind, see ``instructions.py``), unary and stream, chat and messages, beside the
floor's (``--rev REV``: REV's gateway instead of the working tree's); ``--baseline-rev REV``
adds REV's gateway (from ``git archive``) and issue 28's check, at most half of REV's per
case; ``--instructions-top K`` adds each case's K functions by self cost. Streamed chunks
come 5 ms apart there (``--itl-ms``): one read each, as in a real stream. JSON, then one
line starting ``instructions per request:``.

    python bench/overhead.py --instructions [--instructions-requests 200] [--rev REV]
                             [--baseline-rev 360af9b] [--instructions-top 20]
                             [--instructions-keep DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import instructions
import orjson
import uvloop
from processes import (
    free_port,
    start_fake,
    start_fake_anthropic,
    start_floor,
    start_gateway,
    stop,
    wait_ready,
)

SYSTEM = "You are a helpful assistant."
QUESTION = "Summarise the plot of Hamlet in two sentences."
BODIES = {
    "openai": {"model": "bench-model", "messages": [
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
        "max_tokens": 64},
    "anthropic": {"model": "bench-claude", "max_tokens": 64, "system": SYSTEM,
                  "messages": [{"role": "user", "content": QUESTION}]},
}
PATHS = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages"}
#: Results are named f"{PREFIX[api]}{mode}_c{concurrency}".
PREFIX = {"openai": "", "anthropic": "messages_"}
#: The gateway's config for the Anthropic side (the key is only checked for presence).
ANTHROPIC_CONFIG = """
[upstreams.claude]
type = "anthropic"
base_url = "http://127.0.0.1:{port}"
api_key_env = "BENCH_ANTHROPIC_KEY"
[models."bench-claude"]
targets = [{{ upstream = "claude", model = "claude-bench" }}]
"""
TARGETS = ("direct", "floor", "gateway")
PROXIES = ("floor", "gateway")


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


async def run_load(session: aiohttp.ClientSession, url: str, stream: bool, concurrency: int,
                   requests: int, headers: dict[str, str], api: str = "openai") -> Load:
    body = orjson.dumps({**BODIES[api], "stream": stream})
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


def over_direct(proxy: Load, direct: Load, rounds: list[dict[str, Load]],
                name: str) -> dict[str, Any]:
    """One proxy's summary plus what it adds over direct (ms) and its throughput ratio:
    pooled over all rounds, and the median of the per-round figures (``*_median``: what the
    acceptance checks read, since a burst of noise on this shared VM spoils one round, not
    the median)."""
    p, d = proxy.summary(), direct.summary()
    row = {**p, "added_p50_ms": round(p["p50_ms"] - d["p50_ms"], 3),
           "added_p99_ms": round(p["p99_ms"] - d["p99_ms"], 3)}
    if p["ttft_p50_ms"] is not None and d["ttft_p50_ms"] is not None:
        row["added_ttft_p50_ms"] = round(p["ttft_p50_ms"] - d["ttft_p50_ms"], 3)
        row["added_ttft_p99_ms"] = round(p["ttft_p99_ms"] - d["ttft_p99_ms"], 3)
    row["throughput_ratio"] = round(proxy.rps / direct.rps, 3)
    ratios = [round(r[name].rps / r["direct"].rps, 3) for r in rounds]
    added = [round(pct(r[name].latencies, 50) - pct(r["direct"].latencies, 50), 3)
             for r in rounds]
    row["throughput_ratio_per_round"] = ratios
    row["throughput_ratio_median"] = round(statistics.median(ratios), 3)
    row["added_p50_ms_per_round"] = added
    row["added_p50_ms_median"] = round(statistics.median(added), 3)
    return row


async def measure(session: aiohttp.ClientSession, urls: dict[str, str], stream: bool,
                  conc: int, requests: int, rounds: int,
                  headers: dict[str, str], api: str = "openai") -> dict[str, Any]:
    # warm every path (connections, code caches) before measuring
    for url in urls.values():
        await run_load(session, url, stream, conc, max(50, conc * 4), headers, api)
    pooled = {t: Load() for t in TARGETS}
    per_round: list[dict[str, Load]] = []
    for r in range(rounds):
        # Short rounds, rotating who goes first, so drift in the machine's speed hits all.
        order = TARGETS[r % 3:] + TARGETS[:r % 3]
        runs = {}
        for t in order:
            runs[t] = await run_load(session, urls[t], stream, conc, requests // rounds,
                                     headers, api)
            pooled[t].add(runs[t])
        per_round.append(runs)
    row: dict[str, Any] = {"direct": pooled["direct"].summary()}
    for t in PROXIES:
        row[t] = over_direct(pooled[t], pooled["direct"], per_round, t)
    return row


def acceptance(results: dict[str, Any]) -> dict[str, Any]:
    """The issue's checks, on the measurements present (each needs c=1 or c=32)."""
    checks: dict[str, Any] = {}
    for mode in ("unary", "stream"):
        if row := results.get(f"{mode}_c1"):
            g, f = row["gateway"]["added_p50_ms_median"], row["floor"]["added_p50_ms_median"]
            excess = round(g - f, 3)
            checks[f"{mode}_c1_added_p50"] = {
                "gateway_added_p50_ms": g, "floor_added_p50_ms": f,
                "excess_ms": excess, "max_excess_ms": 0.1, "holds": excess <= 0.1}
    for mode in ("unary", "stream"):
        if row := results.get(f"{mode}_c32"):
            g = row["gateway"]["throughput_ratio"]
            f = row["floor"]["throughput_ratio"]
            rel = round(g / f, 3)
            checks[f"{mode}_c32_throughput"] = {
                "gateway_over_direct": g, "floor_over_direct": f,
                "gateway_over_floor": rel, "min_gateway_over_floor": 0.9, "holds": rel >= 0.9}
    for mode in ("unary", "stream"):
        if row := results.get(f"{mode}_c32"):
            g, f = row["gateway"]["added_p99_ms"], row["floor"]["added_p99_ms"]
            limit = round(1.5 * f + 2, 3)
            checks[f"{mode}_c32_added_p99"] = {
                "gateway_added_p99_ms": g, "floor_added_p99_ms": f,
                "limit_ms": limit, "holds": g <= limit}
    for mode in ("unary", "stream"):
        chat, messages = results.get(f"{mode}_c1"), results.get(f"messages_{mode}_c1")
        if chat and messages:
            c, m = (round(r["gateway"]["added_p50_ms_median"]
                          - r["floor"]["added_p50_ms_median"], 3) for r in (chat, messages))
            checks[f"messages_{mode}_c1_excess_vs_chat"] = {
                "messages_excess_ms": m, "chat_excess_ms": c, "max_ms": round(c + 0.1, 3),
                "holds": m <= c + 0.1}
    for mode in ("unary", "stream"):
        chat, messages = results.get(f"{mode}_c32"), results.get(f"messages_{mode}_c32")
        if chat and messages:
            c, m = (round(r["gateway"]["throughput_ratio"]
                          / r["floor"]["throughput_ratio"], 3) for r in (chat, messages))
            checks[f"messages_{mode}_c32_throughput_vs_chat"] = {
                "messages_over_floor": m, "chat_over_floor": c,
                "min_over_floor": round(0.95 * c, 3), "holds": m >= 0.95 * c}
    checks["all_hold"] = all(c["holds"] for c in checks.values())
    return checks


def summary_line(results: dict[str, Any], checks: dict[str, Any]) -> str:
    def yn(c: dict[str, Any]) -> str:
        return "yes" if c["holds"] else "NO"

    parts = []
    for mode in ("unary", "stream"):
        if c := checks.get(f"{mode}_c1_added_p50"):
            parts.append(f"c1 {mode} added p50 gateway {c['gateway_added_p50_ms']} vs floor "
                         f"{c['floor_added_p50_ms']} ms ({c['excess_ms']:+} <= 0.1: {yn(c)})")
    for mode in ("unary", "stream"):
        if c := checks.get(f"{mode}_c32_throughput"):
            parts.append(f"c32 {mode} throughput/direct gateway {c['gateway_over_direct']} vs "
                         f"floor {c['floor_over_direct']} ({c['gateway_over_floor']} >= 0.9: "
                         f"{yn(c)})")
    for mode in ("unary", "stream"):
        if c := checks.get(f"{mode}_c32_added_p99"):
            parts.append(f"c32 {mode} added p99 gateway {c['gateway_added_p99_ms']} vs floor "
                         f"{c['floor_added_p99_ms']} ms (<= {c['limit_ms']}: {yn(c)})")
    for mode in ("unary", "stream"):
        if c := checks.get(f"messages_{mode}_c1_excess_vs_chat"):
            parts.append(f"c1 {mode} /v1/messages excess over floor {c['messages_excess_ms']} "
                         f"vs chat {c['chat_excess_ms']} ms (<= {c['max_ms']}: {yn(c)})")
    for mode in ("unary", "stream"):
        if c := checks.get(f"messages_{mode}_c32_throughput_vs_chat"):
            parts.append(f"c32 {mode} /v1/messages throughput/floor {c['messages_over_floor']} "
                         f"vs chat {c['chat_over_floor']} (>= {c['min_over_floor']}: {yn(c)})")
    errors = {t: sum(r[t]["errors"] for r in results.values()) for t in PROXIES}
    if any(errors.values()):
        parts.append(f"errors gateway {errors['gateway']} floor {errors['floor']}")
    parts.append(f"all hold: {'yes' if checks['all_hold'] else 'NO'}")
    return "overhead: " + "; ".join(parts)


def steering(args: argparse.Namespace) -> dict[str, str]:
    """The fake upstreams' steering headers: chunks per response, TTFT, inter-chunk gap."""
    headers = {"x-fake-tokens": str(args.tokens)}
    if args.ttft_ms:
        headers["x-fake-ttft-ms"] = str(args.ttft_ms)
    if args.itl_ms:
        headers["x-fake-itl-ms"] = str(args.itl_ms)
    return headers


async def bench(args: argparse.Namespace, urls: dict[str, dict[str, str]]
                ) -> dict[str, Any]:
    headers = steering(args)
    api_headers = {"openai": headers, "anthropic": {
        **headers, "x-api-key": "bench", "anthropic-version": "2023-06-01"}}
    results: dict[str, Any] = {}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        for api in args.apis:
            for stream in (False, True):
                for conc in args.concurrency:
                    n = args.requests if conc == 1 else args.requests * 2
                    name = f"{PREFIX[api]}{'stream' if stream else 'unary'}_c{conc}"
                    results[name] = await measure(session, urls[api], stream, conc, n,
                                                  args.rounds, api_headers[api], api)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000,
                        help="requests per target per measurement at concurrency 1 (x2 above)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--rounds", type=int, default=10,
                        help="rounds per measurement, each running direct, floor and gateway")
    parser.add_argument("--tokens", type=int, default=16, help="content chunks per response")
    parser.add_argument("--ttft-ms", type=float, default=0)
    parser.add_argument("--itl-ms", type=float, default=None,
                        help="gap between streamed chunks (default 0; --instructions: "
                             f"{instructions.ITL_MS}, so each chunk is its own read)")
    parser.add_argument("--apis", nargs="+", choices=("openai", "anthropic"),
                        default=["openai", "anthropic"])
    parser.add_argument("--instructions", action="store_true",
                        help="count the instructions per request instead (callgrind)")
    parser.add_argument("--instructions-requests", type=int, default=200,
                        help="requests counted per case")
    parser.add_argument("--instructions-warmup", type=int, default=50,
                        help="requests per case before counting")
    parser.add_argument("--instructions-top", type=int, default=0, metavar="K",
                        help="also each case's K functions by self cost")
    parser.add_argument("--instructions-keep", type=Path, metavar="DIR",
                        help="keep the callgrind dumps (callgrind_annotate, kcachegrind) here")
    parser.add_argument("--baseline-rev", help="--instructions: also this git revision's")
    parser.add_argument("--rev", help="--instructions: this git revision's gateway instead "
                                      "of the working tree's")
    args = parser.parse_args()
    if args.itl_ms is None:
        args.itl_ms = instructions.ITL_MS if args.instructions else 0
    if args.instructions:
        return instructions.main(args, BODIES, PATHS, steering(args))
    fake_port, floor_port, gw_port = free_port(), free_port(), free_port()
    anth_port, anth_floor_port = free_port(), free_port()
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            procs.append(start_fake(fake_port))
            procs.append(start_floor(floor_port, fake_port))
            procs.append(start_fake_anthropic(anth_port))
            procs.append(start_floor(anth_floor_port, anth_port))
            os.environ["BENCH_ANTHROPIC_KEY"] = "bench"
            procs.append(start_gateway(gw_port, fake_port, Path(tmp), 'version = "bench"\n',
                                       config_extra=ANTHROPIC_CONFIG.format(port=anth_port)))
            ports = {"openai": (fake_port, floor_port, gw_port),
                     "anthropic": (anth_port, anth_floor_port, gw_port)}
            urls = {api: {t: f"http://127.0.0.1:{port}{PATHS[api]}"
                          for t, port in zip(TARGETS, ports[api])} for api in PATHS}

            async def go() -> dict[str, Any]:
                await wait_ready(f"http://127.0.0.1:{fake_port}/v1/models")
                await wait_ready(f"http://127.0.0.1:{floor_port}/v1/models")
                await wait_ready(f"http://127.0.0.1:{gw_port}/healthz")
                await wait_ready(urls["anthropic"]["floor"], post=BODIES["anthropic"],
                                 headers={"x-api-key": "bench",
                                          "anthropic-version": "2023-06-01"})
                return await bench(args, urls)

            results = uvloop.run(go())
        finally:
            stop(procs)
    checks = acceptance(results)
    doc = {"bench": "overhead", "cpus": os.cpu_count(), "tokens_per_response": args.tokens,
           "upstream_ttft_ms": args.ttft_ms, "upstream_itl_ms": args.itl_ms,
           "results": results, "acceptance": checks}
    print(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())
    print(summary_line(results, checks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
