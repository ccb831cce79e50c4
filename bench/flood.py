"""A flood against `make run`'s stack: the embedded defaults (gateway.example.toml and its
policy, the local engine serving SmolLM2-135M) under many more clients than the engine
batches.

First the unloaded latency: ``--warm`` requests one at a time (their p50 is the yardstick).
Then ``--clients`` closed-loop clients (96) for ``--seconds`` (20), each sending one request
after another: a unique prompt, ``max_tokens`` 16, a ``--timeout-s`` (30) client timeout; a
shed answer's ``retry-after-ms`` (else ``Retry-After``) is waited out first, as the openai and
anthropic SDKs do. Every answer is sorted: admitted (200), shed (503/429, which must say why
in ``x-gateway-degraded``), a client timeout, or another failure.

Targets (issue 16): no client timeouts; shed answers labelled, their p99 at most 50 ms;
admitted answers' p99 at most 4x the unloaded p50.

Side by side, the same flood (same clients, same seconds) against ``bench/floor_shed.py``, a
bare aiohttp server that sheds every request at once: its shed p99 is what the clients, the
connections and the machine cost by themselves. Both are also given without the first
second, when all clients open their connections and send at once, and the gateway's shed
time from its own log.

    python bench/flood.py [--clients 96] [--seconds 20] [--config gateway.example.toml]
                          [--keep-log PATH] [--no-floor]

Prints a JSON document, then one summary line starting ``flood:``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from processes import ROOT, free_port, start_floor_shed, stop, wait_ready


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 1)


def start(config: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config),
               "--port", str(port)]
    with log.open("wb") as out:
        return subprocess.Popen(command, cwd=ROOT, stdout=out)


#: One answer: (outcome, ms, degraded label, Retry-After s).
Result = tuple[str, float, str | None, float]


async def one(session: aiohttp.ClientSession, url: str, prompt: str, timeout_s: float
              ) -> Result:
    """(outcome, ms, degraded label, Retry-After s): outcome ok | shed | timeout |
    error:<status>."""
    body = orjson.dumps({"model": "smollm2", "max_tokens": 16, "temperature": 0,
                         "messages": [{"role": "user", "content": prompt}]})
    t0 = time.perf_counter()
    try:
        async with session.post(url, data=body, headers={"content-type": "application/json"},
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            await r.read()
            ms = (time.perf_counter() - t0) * 1000
            label = r.headers.get("x-gateway-degraded")
            try:  # as the openai and anthropic SDKs read it: retry-after-ms first
                hint_ms = r.headers.get("retry-after-ms")
                retry_after = (float(hint_ms) / 1000 if hint_ms is not None
                               else float(r.headers.get("retry-after", 0)))
            except ValueError:
                retry_after = 0.0
            if r.status == 200:
                return "ok", ms, label, 0.0
            if r.status in (429, 503, 529):
                return "shed", ms, label, retry_after
            return f"error:{r.status}", ms, label, retry_after
    except TimeoutError:
        return "timeout", (time.perf_counter() - t0) * 1000, None, 0.0
    except aiohttp.ClientError as exc:
        return f"error:{type(exc).__name__}", (time.perf_counter() - t0) * 1000, None, 0.0


async def flood(session: aiohttp.ClientSession, url: str, args: argparse.Namespace,
                prompt: Callable[[], str]) -> tuple[list[Result], list[float]]:
    """``--clients`` closed-loop clients for ``--seconds``, all starting at once: each
    answer, and when its request was sent (s after the start)."""
    results: list[Result] = []
    sent_at: list[float] = []
    began = time.perf_counter()
    stop_at = began + args.seconds

    async def client() -> None:
        # As the official SDKs do: a shed answer's Retry-After is waited out before the
        # next request (capped, so the run stays in its window).
        while time.perf_counter() < stop_at:
            sent = time.perf_counter() - began
            result = await one(session, url, prompt(), args.timeout_s)
            results.append(result)
            sent_at.append(sent)
            if result[3]:
                await asyncio.sleep(min(result[3], max(0.0, stop_at - time.perf_counter())))

    await asyncio.gather(*(client() for _ in range(args.clients)))
    return results, sent_at


def shed_ms(results: list[Result], sent_at: list[float]) -> dict[str, Any]:
    """Shed answers' p50/p99 (ms), also without those sent in the first second (the opening
    burst, when every client opens its connection and sends at once)."""
    shed = [ms for outcome, ms, _, _ in results if outcome == "shed"]
    later = [r[1] for r, t in zip(results, sent_at, strict=True)
             if r[0] == "shed" and t >= 1.0]
    return {"n": len(shed), "p50": pct(shed, 0.5), "p99": pct(shed, 0.99),
            "after_first_second": {"p50": pct(later, 0.5), "p99": pct(later, 0.99)}}


async def floor_flood(args: argparse.Namespace) -> dict[str, Any]:
    """The same flood against bench/floor_shed.py, which sheds every request at once."""
    port = free_port()
    proc = start_floor_shed(port)
    try:
        await wait_ready(f"http://127.0.0.1:{port}/readyz")
        counter = itertools.count()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            results, sent_at = await flood(
                session, f"http://127.0.0.1:{port}/v1/chat/completions", args,
                lambda: f"Request {next(counter)}")
    finally:
        stop([proc])
    return shed_ms(results, sent_at)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    with tempfile.TemporaryDirectory() as tmp:
        proc = start(Path(args.config).resolve(), port, Path(tmp) / "gateway.log")
        try:
            await wait_ready(f"http://127.0.0.1:{port}/readyz", timeout=300)
            counter = itertools.count()

            def prompt() -> str:
                n = next(counter)
                return f"Request {n}: name {n % 7 + 2} rivers in country number {n}."

            async with aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(limit=0)) as session:
                for _ in range(3):  # engine warm-up, not measured
                    await one(session, url, prompt(), args.timeout_s)
                unloaded = [(await one(session, url, prompt(), args.timeout_s))[1]
                            for _ in range(args.warm)]
                results, sent_at = await flood(session, url, args, prompt)
        finally:
            stop([proc])
            if args.keep_log:
                shutil.copy(Path(tmp) / "gateway.log", args.keep_log)
            server_shed = []
            for line in (Path(tmp) / "gateway.log").read_bytes().splitlines():
                try:
                    rec = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue
                if isinstance(rec, dict) and rec.get("status") in (429, 503):
                    server_shed.append(float(rec["total_ms"]))
    floor = await floor_flood(args) if args.floor else None
    ok = [ms for outcome, ms, _, _ in results if outcome == "ok"]
    sheds = shed_ms(results, sent_at)
    unlabelled = sum(1 for outcome, _, label, _ in results if outcome == "shed" and not label)
    outcomes: dict[str, int] = {}
    for outcome, _, _, _ in results:
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    labels: dict[str, int] = {}
    for _, _, label, _ in results:
        if label:
            labels[label] = labels.get(label, 0) + 1
    unloaded_p50 = statistics.median(unloaded)
    admitted_p99 = pct(ok, 0.99)
    shed_p99 = sheds["p99"]
    return {
        "config": args.config, "clients": args.clients, "seconds": args.seconds,
        "unloaded_ms": {"p50": round(unloaded_p50, 1), "p99": pct(unloaded, 0.99)},
        "outcomes": outcomes, "degraded_labels": labels, "unlabelled_sheds": unlabelled,
        "admitted_ms": {"p50": pct(ok, 0.5), "p99": admitted_p99},
        "shed_ms": sheds,
        "floor_shed_ms": floor,
        "shed_ms_in_gateway": {"p50": pct(server_shed, 0.5), "p99": pct(server_shed, 0.99)},
        "goodput_rps": round(len(ok) / args.seconds, 2),
        "admitted_p99_over_unloaded_p50": (round(admitted_p99 / unloaded_p50, 2)
                                           if admitted_p99 else None),
        "targets": {
            "no_timeouts": outcomes.get("timeout", 0) == 0,
            "sheds_labelled": unlabelled == 0,
            "shed_p99_le_50ms": shed_p99 is None or shed_p99 <= 50,
            "admitted_p99_le_4x_unloaded_p50": bool(admitted_p99)
            and admitted_p99 <= 4 * unloaded_p50,
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=str(ROOT / "gateway.example.toml"))
    parser.add_argument("--clients", type=int, default=96)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warm", type=int, default=10)
    parser.add_argument("--timeout-s", type=float, default=30.0)
    parser.add_argument("--keep-log", metavar="PATH", help="copy the gateway's log here")
    parser.add_argument("--no-floor", dest="floor", action="store_false",
                        help="skip the same flood against bench/floor_shed.py")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    t = result["targets"]
    floor = ""
    if f := result["floor_shed_ms"]:
        floor = (f"; floor_shed.py under the same flood {f['p99']} ms, after the first second "
                 f"{f['after_first_second']['p99']} ms")
    print(f"flood: {result['outcomes']} unloaded p50 {result['unloaded_ms']['p50']} ms; "
          f"admitted p99 {result['admitted_ms']['p99']} ms "
          f"({result['admitted_p99_over_unloaded_p50']}x, <=4x "
          f"{'yes' if t['admitted_p99_le_4x_unloaded_p50'] else 'NO'}); shed p99 "
          f"{result['shed_ms']['p99']} ms (<=50 {'yes' if t['shed_p99_le_50ms'] else 'NO'}; "
          f"after the first second {result['shed_ms']['after_first_second']['p99']} ms; in "
          f"the gateway {result['shed_ms_in_gateway']['p99']} ms{floor}); "
          f"timeouts {result['outcomes'].get('timeout', 0)} "
          f"({'yes' if t['no_timeouts'] else 'NO'}); labelled "
          f"{'yes' if t['sheds_labelled'] else 'NO'}")
    return 0 if all(t.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
