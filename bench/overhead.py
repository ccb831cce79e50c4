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

And of issue 30 (``responses`` in ``--apis``, as by default): the gateway's
``/v1/responses``, translated to the fake OpenAI upstream's chat endpoint (the upstream is
not ``native_responses``; ``store`` unset, so the gateway keeps each response, as OpenAI's
default asks), against the gateway's ``/v1/chat/completions`` on the same fake with the same
conversation, the two and direct (the fake's chat endpoint) in the same interleaved rounds
(``responses_*`` results: ``chat`` and ``responses`` over ``direct``):

- c=1, unary and stream: its added p50 <= chat's + 0.1 ms;
- c=32, unary and stream: its throughput >= 0.95 x chat's (pooled: direct cancels).

And ``native`` (by default too): /v1/responses to a ``native_responses`` upstream (the
fake's own Responses API, nothing translated), direct, through the floor and through the
gateway like chat, held to chat's figures over the floor (``bench/overhead_checks.py``'s
``native_checks``).

The checks and the summary line are computed in ``overhead_checks.py``.

    python bench/overhead.py [--requests 2000] [--concurrency 1 32] [--rounds 10]
                             [--apis openai anthropic responses]

Prints a JSON document (``results`` per measurement, ``acceptance`` per check), then one
summary line starting ``overhead:``.

``--instructions`` measures instead the instructions the gateway process executes per
request (callgrind, see ``instructions.py``), unary and stream, chat and messages, beside the
floor's, and (``responses``, ``native`` in ``--apis``) /v1/responses beside chat's count
(``--rev REV``: REV's gateway instead of the working tree's); ``--baseline-rev REV``
adds REV's gateway (from ``git archive``) and issue 28's check, at most half of REV's per
case; ``--instructions-top K`` adds each case's K functions by self cost. Streamed chunks
come 5 ms apart there (``--itl-ms``): one read each, as in a real stream. JSON, then one
line starting ``instructions per request:``.

    python bench/overhead.py --instructions [--instructions-requests 200] [--rev REV]
                             [--baseline-rev 360af9b] [--instructions-top 20]
                             [--instructions-keep DIR] [--instructions-policy TOML]
                             [--instructions-config TOML]
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
from overhead_checks import acceptance, summary_line
from processes import (
    NATIVE_RESPONSES,
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
    # The same conversation as "openai"'s, as a Responses request.
    "responses": {"model": "bench-model", "instructions": SYSTEM, "input": QUESTION,
                  "max_output_tokens": 64},
    # ... to a native_responses upstream (the fake's own /v1/responses), over its floor
    "native": {"model": "bench-native", "instructions": SYSTEM, "input": QUESTION,
               "max_output_tokens": 64},
}
PATHS = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages",
         "responses": "/v1/responses", "native": "/v1/responses"}
#: Results are named f"{PREFIX[api]}{mode}_c{concurrency}".
PREFIX = {"openai": "", "anthropic": "messages_", "responses": "responses_",
          "native": "native_"}
#: The gateway's config for the Anthropic side (the key is only checked for presence).
ANTHROPIC_CONFIG = """
[upstreams.claude]
type = "anthropic"
forward_headers = ["x-fake-*"]
base_url = "http://127.0.0.1:{port}"
api_key_env = "BENCH_ANTHROPIC_KEY"
[models."bench-claude"]
targets = [{{ upstream = "claude", model = "claude-bench" }}]
""" + NATIVE_RESPONSES
#: Who each API's measurement runs in its rounds, direct (the fake itself) first, and
#: which API's body each is sent.
TARGETS = {"openai": {"direct": "openai", "floor": "openai", "gateway": "openai"},
           "anthropic": {"direct": "anthropic", "floor": "anthropic", "gateway": "anthropic"},
           "responses": {"direct": "openai", "chat": "openai", "responses": "responses"},
           "native": {"direct": "native", "floor": "native", "gateway": "native"}}


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
    """One measurement of ``TARGETS[api]`` (``urls``: target -> URL): a row of results."""
    bodies = TARGETS[api]
    targets = tuple(bodies)
    # warm every path (connections, code caches) before measuring
    for t in targets:
        await run_load(session, urls[t], stream, conc, max(50, conc * 4), headers, bodies[t])
    pooled = {t: Load() for t in targets}
    per_round: list[dict[str, Load]] = []
    for r in range(rounds):
        # Short rounds, rotating who goes first, so drift in the machine's speed hits all.
        order = targets[r % len(targets):] + targets[:r % len(targets)]
        runs = {}
        for t in order:
            runs[t] = await run_load(session, urls[t], stream, conc, requests // rounds,
                                     headers, bodies[t])
            pooled[t].add(runs[t])
        per_round.append(runs)
    row: dict[str, Any] = {"direct": pooled["direct"].summary()}
    for t in targets[1:]:
        row[t] = over_direct(pooled[t], pooled["direct"], per_round, t)
    return row


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
    api_headers = {"openai": headers, "responses": headers, "native": headers, "anthropic": {
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
                        help="rounds per measurement, each running every target (direct, "
                             "floor, gateway; --apis responses: direct, chat, responses)")
    parser.add_argument("--tokens", type=int, default=16, help="content chunks per response")
    parser.add_argument("--ttft-ms", type=float, default=0)
    parser.add_argument("--itl-ms", type=float, default=None,
                        help="gap between streamed chunks (default 0; --instructions: "
                             f"{instructions.ITL_MS}, so each chunk is its own read)")
    parser.add_argument("--apis", nargs="+", choices=tuple(PATHS),
                        default=["openai", "anthropic", "responses", "native"])
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
    parser.add_argument("--instructions-policy", type=Path, metavar="TOML",
                        help="--instructions: appended to the gateway's policy (not the "
                             "baseline's): a feature's cost, on against off")
    parser.add_argument("--instructions-config", type=Path, metavar="TOML",
                        help="--instructions: appended to the gateway's config (not the "
                             "baseline's; {collector}: the URL of an OTLP receiver the bench "
                             "runs), e.g. bench/tracing.toml")
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
                                       config_extra=ANTHROPIC_CONFIG.format(port=anth_port,
                                                                           openai=fake_port)))
            ports = {"openai": (fake_port, floor_port, gw_port),
                     "anthropic": (anth_port, anth_floor_port, gw_port),
                     "native": (fake_port, floor_port, gw_port)}
            urls = {api: {t: f"http://127.0.0.1:{port}{PATHS[api]}"
                          for t, port in zip(TARGETS[api], ports[api])} for api in ports}
            # /v1/responses beside /v1/chat/completions, on the same gateway and fake
            urls["responses"] = {"direct": urls["openai"]["direct"],
                                 "chat": urls["openai"]["gateway"],
                                 "responses": f"http://127.0.0.1:{gw_port}{PATHS['responses']}"}

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
