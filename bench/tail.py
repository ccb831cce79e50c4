"""Tail-latency techniques, side by side in one run (issue 31). So far: coalescing,
latency-aware choice among replicas, hedging, keepalive, fairness between keys.

Coalescing: 50 identical concurrent requests (temperature 0), unary and streamed, through a
gateway with the ``coalesce`` stage on and one with it off, both in front of the same fake
upstream (in this process, so its calls are counted; a 300 ms time to first token, so the
50 are in flight together). For each: upstream calls made, whether every client received
the whole answer, all identical, and the clients' p50/max latency.

    python bench/tail.py [--clients 50] [--ttft-ms 300] [--replica-ms 20] [--concurrency 8]
                         [--keepalive-full]

Latency-aware choice: three replicas of one model behind a balanced gateway (policy
``[balance]``), one slowed 5x (time to first byte): the share of requests the fast ones
serve in the first 2 s of a closed loop at ``--concurrency``, and the p50 against the fast
replica's own (asked directly through its own model).

Hedging: two replicas whose time to answer is heavy-tailed (5% of requests 20x the median,
at random), behind a gateway without hedging and one hedging after ``--hedge-after-ms``: p99
latency, and the upstream calls made per request. Then the same under 3x overload: the
replicas serve ``--concurrency`` requests at once between them (the rest wait their turn)
and three times as many clients ask, so every answer is slow: the extra calls hedging makes
there (the budget must keep them at most 2%: hedges are earned by answers in time).

Keepalive: a stream whose first token comes after 5 s, read through a 3 s idle timeout, from
a gateway sending keepalive comments every second and from one sending none;
``--keepalive-full``: issue 31's figures unscaled, a 45 s first token through a 30 s idle
timeout, with the default policy's keepalive (15 s); 75 s longer.

Fairness: four gateway keys through an upstream admitted 4 at a time, one key with 10x the
others' clients: each light key's goodput against its fair share, keys taking turns in the
queue, beside all of them sending one key (first come, first served).

Priority: interactive requests (``x-gateway-priority: high``) through the same 4 slots, alone
and while 40 batch clients (``low``) fill the rest: the interactive p99 against its own
unloaded p99, with batch held to half of the slots (``admission.low_priority_share``)
beside batch free to hold them all.

Prints a JSON document and one line starting ``tail:``. Not measured yet: ``make run``'s
replay and flood (issue 31).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from processes import free_port, start_gateway, stop, wait_ready
from tail_admission import fairness, priority

from gateway.testing.fake_upstream import FakeUpstream
from gateway.testing.server import ServerThread

POLICIES = {"on": 'version = "bench"\n',
            "off": 'version = "bench"\n[coalesce]\nenabled = false\n'}


async def burst(url: str, clients: int, stream: bool, ttft_ms: float
                ) -> tuple[list[bytes], list[float]]:
    """``clients`` identical requests at once: each one's answer text and latency (ms)."""
    body = orjson.dumps({"model": "bench-model", "temperature": 0, "stream": stream,
                         "messages": [{"role": "user", "content": "The same question?"}]})
    headers = {"content-type": "application/json", "x-fake-ttft-ms": str(ttft_ms),
               "x-fake-tokens": "32"}

    async def one(session: aiohttp.ClientSession) -> tuple[bytes, float]:
        t0 = time.perf_counter()
        async with session.post(url, data=body, headers=headers) as r:
            raw = await r.read()
        took = (time.perf_counter() - t0) * 1000
        if not stream:
            return orjson.loads(raw)["choices"][0]["message"]["content"].encode(), took
        text = b""
        for line in raw.split(b"\n"):
            if line.startswith(b"data: {"):
                chunk = orjson.loads(line[6:])
                for choice in chunk.get("choices") or ():
                    text += (choice["delta"].get("content") or "").encode()
        return text, took

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        done = await asyncio.gather(*(one(session) for _ in range(clients)))
    return [t for t, _ in done], [ms for _, ms in done]


REPLICAS = """
[upstreams.fast1]
type = "openai"
forward_headers = ["x-fake-*"]
base_url = "http://127.0.0.1:{port}/r1/v1"
headers = {{ "x-fake-ttft-ms" = "{fast}" }}
[upstreams.fast2]
type = "openai"
forward_headers = ["x-fake-*"]
base_url = "http://127.0.0.1:{port}/r2/v1"
headers = {{ "x-fake-ttft-ms" = "{fast}" }}
[upstreams.slow]
type = "openai"
forward_headers = ["x-fake-*"]
base_url = "http://127.0.0.1:{port}/r3/v1"
headers = {{ "x-fake-ttft-ms" = "{slow}" }}
[models.replicas]
targets = [{{ upstream = "slow", model = "m" }}, {{ upstream = "fast1", model = "m" }},
           {{ upstream = "fast2", model = "m" }}]
[models.fast]
targets = [{{ upstream = "fast1", model = "m" }}]
"""
BALANCED = 'version = "bench"\n[balance]\nmodels = { "replicas" = "peak_ewma" }\n'


async def closed_loop(url: str, model: str, seconds: float, concurrency: int,
                      fake: FakeUpstream | None = None) -> tuple[list[float], list[str]]:
    """``concurrency`` clients asking one after another for ``seconds``: each request's
    latency (ms) and, with ``fake``, the replica that served it, in order of completion."""
    body = orjson.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})
    took: list[float] = []
    deadline = time.perf_counter() + seconds

    async def client(session: aiohttp.ClientSession) -> None:
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            async with session.post(url, data=body,
                                    headers={"content-type": "application/json"}) as r:
                await r.read()
            took.append((time.perf_counter() - t0) * 1000)

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
    served = [r.path.split("/")[1] for r in fake.records] if fake is not None else []
    return took, served


async def latency_aware(args: argparse.Namespace, fake: FakeUpstream, upstream: int,
                        tmp: Path) -> dict[str, Any]:
    """One replica of three slowed 5x: where a balanced model's requests go in its first 2 s,
    and their p50 against the fast replica's own."""
    port = free_port()
    folder = tmp / "balanced"
    folder.mkdir()
    extra = REPLICAS.format(port=upstream, fast=args.replica_ms, slow=5 * args.replica_ms)
    proc = start_gateway(port, upstream, folder, BALANCED, config_extra=extra)
    try:
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        await wait_ready(url, timeout=120, post={
            "model": "bench-model", "messages": [{"role": "user", "content": "up"}]})
        fake.clear()
        took, served = await closed_loop(url, "replicas", 2.0, args.concurrency, fake)
        fake.clear()
        fast_took, _ = await closed_loop(url, "fast", 2.0, args.concurrency)
    finally:
        stop([proc])
    fast_share = sum(1 for r in served if r != "r3") / len(served)
    p50, fast_p50 = sorted(took)[len(took) // 2], sorted(fast_took)[len(fast_took) // 2]
    return {"replica_ttft_ms": {"fast": args.replica_ms, "slow": 5 * args.replica_ms},
            "requests_first_2_s": len(served), "share_to_fast": round(fast_share, 3),
            "p50_ms": round(p50, 1), "fast_replica_p50_ms": round(fast_p50, 1),
            "p50_over_fast": round(p50 / fast_p50, 3),
            "ok": fast_share >= 0.9 and p50 <= 1.2 * fast_p50}


class TailedUpstream:
    """A chat upstream whose time to answer is heavy-tailed: ``median_ms`` mostly, ``tail_ms``
    for a ``tail_share`` of requests at random (seeded); it counts the calls it gets."""

    def __init__(self, median_ms: float, tail_ms: float, tail_share: float) -> None:
        self.median_s, self.tail_s, self.share = median_ms / 1000, tail_ms / 1000, tail_share
        self.rng = random.Random(0)
        self.calls = 0
        #: Requests served at once at most, between all paths (None: no limit): overload.
        self.seats: asyncio.Semaphore | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        self.calls += 1
        took = self.tail_s if self.rng.random() < self.share else self.median_s
        if self.seats is None:
            await asyncio.sleep(took)
        else:
            async with self.seats:
                await asyncio.sleep(took)
        body = orjson.dumps({"id": "x", "object": "chat.completion", "created": 0,
                             "model": "m", "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "ok"}}],
                             "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                       "total_tokens": 2}})
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})


HEDGED = """
[upstreams.a]
type = "openai"
forward_headers = ["x-fake-*"]
base_url = "http://127.0.0.1:{port}/a/v1"
[upstreams.b]
type = "openai"
forward_headers = ["x-fake-*"]
base_url = "http://127.0.0.1:{port}/b/v1"
[models.pair]
targets = [{{ upstream = "a", model = "m" }}, {{ upstream = "b", model = "m" }}]
"""


async def hedging(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Two replicas with a heavy-tailed time to answer (5% of requests 20x the median):
    p99 latency without hedging and with (after ``--hedge-after-ms``), and the upstream
    calls per request; then the same with the replicas serving ``--concurrency`` requests at
    once between them and three times as many clients (3x overload)."""
    tailed = TailedUpstream(args.median_ms, 20 * args.median_ms, 0.05)
    out: dict[str, Any] = {"median_ms": args.median_ms, "tail": "5% at 20x",
                           "overload": {"seats": args.concurrency,
                                        "clients": 3 * args.concurrency}}
    with ServerThread(tailed) as srv:
        port = int(srv.url.rsplit(":", 1)[1])
        for name, policy in (("off", 'version = "bench"\n'),
                             ("on", ('version = "bench"\n[balance]\nhedge_after_ms = '
                                    f'{{ "pair" = {args.hedge_after_ms} }}\n'
                                    'hedge_budget = 0.1\n'))):
            gw_port = free_port()
            folder = tmp / f"hedge-{name}"
            folder.mkdir()
            proc = start_gateway(gw_port, port, folder, policy,
                                 config_extra=HEDGED.format(port=port))
            try:
                url = f"http://127.0.0.1:{gw_port}/v1/chat/completions"
                await wait_ready(url, timeout=120, post={
                    "model": "pair", "messages": [{"role": "user", "content": "up"}]})
                for where, clients, seats in (
                        (out, args.concurrency, None),
                        (out["overload"], 3 * args.concurrency, args.concurrency)):
                    tailed.seats = None if seats is None else asyncio.Semaphore(seats)
                    tailed.calls = 0
                    took, _ = await closed_loop(url, "pair", args.hedge_seconds, clients)
                    where[name] = latencies(took, tailed.calls)
            finally:
                stop([proc])
    cut = 1 - out["on"]["p99_ms"] / out["off"]["p99_ms"]
    out["p99_cut"] = round(cut, 3)
    out["ok"] = cut >= 0.4 and out["on"]["extra_calls"] <= 0.10 \
        and out["overload"]["on"]["extra_calls"] <= 0.02
    return out


def latencies(took: list[float], calls: int) -> dict[str, Any]:
    """A closed loop's requests, upstream calls per request over one, p50 and p99 (ms)."""
    took = sorted(took)
    return {"requests": len(took), "upstream_calls": calls,
            "extra_calls": round(calls / len(took) - 1, 4),
            "p50_ms": round(took[len(took) // 2], 1),
            "p99_ms": round(took[int(0.99 * len(took))], 1)}


async def keepalive(fake_port: int, tmp: Path, full: bool = False) -> dict[str, Any]:
    """A stream whose first token comes after 5 s, read through an idle timeout of 3 s (as a
    proxy or load balancer that cuts a connection silent for that long), from a gateway
    sending keepalive comments every second and from one sending none (issue 31's 45 s
    prefill behind a 30 s idle timeout, scaled down 9x; ``full``: those, with the default
    policy's keepalive, 15 s)."""
    first_s, idle_s, every_s = (45, 30, 15) if full else (5, 3, 1)
    out: dict[str, Any] = {"first_token_s": first_s, "idle_timeout_s": idle_s,
                           "keepalive_s": every_s}
    body = orjson.dumps({"model": "bench-model", "stream": True,
                         "messages": [{"role": "user", "content": "slow"}]})
    for name, every in (("on", every_s), ("off", 0)):
        port = free_port()
        folder = tmp / f"keepalive-{name}"
        folder.mkdir()
        proc = start_gateway(port, fake_port, folder,
                             f'version = "bench"\n[streaming]\nkeepalive_s = {every}\n')
        try:
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            await wait_ready(url, timeout=120, post={
                "model": "bench-model", "messages": [{"role": "user", "content": "up"}]})
            idle = aiohttp.ClientTimeout(total=None, sock_read=idle_s)
            try:
                async with aiohttp.ClientSession(timeout=idle) as session, session.post(
                        url, data=body, headers={"content-type": "application/json",
                                                 "x-fake-ttft-ms": str(first_s * 1000)}) as r:
                    raw = await r.read()
                out[name] = "completed" if raw.rstrip().endswith(b"[DONE]") else "cut short"
            except (TimeoutError, aiohttp.ClientError):
                out[name] = "cut by the idle timeout"
        finally:
            stop([proc])
    out["ok"] = out["on"] == "completed"
    return out


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    fake = FakeUpstream()
    results: dict[str, Any] = {}
    with ServerThread(fake) as srv, tempfile.TemporaryDirectory() as tmp:
        upstream = int(srv.url.rsplit(":", 1)[1])
        gateways, procs = {}, []
        for name, policy in POLICIES.items():
            port = free_port()
            folder = Path(tmp) / name
            folder.mkdir()
            procs.append(start_gateway(port, upstream, folder, policy))
            gateways[name] = f"http://127.0.0.1:{port}/v1/chat/completions"
        try:
            for url in gateways.values():
                await wait_ready(url, timeout=120, post={
                    "model": "bench-model", "messages": [{"role": "user", "content": "up"}]})
            for stream in (False, True):
                for name, url in gateways.items():
                    fake.clear()
                    texts, took = await burst(url, args.clients, stream, args.ttft_ms)
                    whole = all(t == texts[0] for t in texts) and texts[0].count(b"w") == 32
                    took.sort()
                    results[f"{'stream' if stream else 'unary'} {name}"] = {
                        "clients": args.clients, "upstream_calls": len(fake.records),
                        "every_client_whole_and_identical": whole,
                        "p50_ms": round(took[len(took) // 2], 1),
                        "max_ms": round(took[-1], 1)}
        finally:
            stop(procs)
        balanced = await latency_aware(args, fake, upstream, Path(tmp))
        hedged = await hedging(args, Path(tmp))
        kept = await keepalive(upstream, Path(tmp), args.keepalive_full)
        fair = await fairness(upstream, Path(tmp), args.fair_seconds)
        fair["priority"] = await priority(upstream, Path(tmp), args.fair_seconds)
    checks = {kind: {"calls_on": results[f"{kind} on"]["upstream_calls"],
                     "calls_off": results[f"{kind} off"]["upstream_calls"],
                     "ok": results[f"{kind} on"]["upstream_calls"] == 1
                     and results[f"{kind} off"]["upstream_calls"] == args.clients
                     and results[f"{kind} on"]["every_client_whole_and_identical"]}
              for kind in ("unary", "stream")}
    return {"coalescing": results, "latency_aware": balanced, "hedging": hedged,
            "keepalive": kept, "fairness": fair,
            "acceptance": {"coalescing": checks, "latency_aware": balanced["ok"],
                           "hedging": hedged["ok"], "keepalive": kept["ok"],
                           "fairness": fair["ok"], "priority": fair["priority"]["ok"]}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--ttft-ms", type=float, default=300.0)
    parser.add_argument("--replica-ms", type=float, default=20.0,
                        help="latency-aware: the fast replicas' time to first byte")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--median-ms", type=float, default=20.0,
                        help="hedging: the replicas' usual time to answer")
    parser.add_argument("--hedge-after-ms", type=float, default=40.0)
    parser.add_argument("--hedge-seconds", type=float, default=8.0)
    parser.add_argument("--fair-seconds", type=float, default=8.0)
    parser.add_argument("--keepalive-full", action="store_true",
                        help="keepalive at issue 31's figures: a 45 s first token, a 30 s "
                             "idle timeout, keepalive every 15 s (75 s longer)")
    args = parser.parse_args()
    out = asyncio.run(bench(args))
    print(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())
    checks, balanced, fair = out["acceptance"]["coalescing"], out["latency_aware"], \
        out["fairness"]
    unfair = min(v["of_fair_share"] for t, v in fair["one key"].items() if t != "heavy")
    print("tail: coalescing " + "; ".join(
        f"{kind} {c['calls_on']} call(s) on vs {c['calls_off']} off, whole and identical: "
        f"{'yes' if c['ok'] else 'NO'}" for kind, c in checks.items())
        + f"; latency-aware: {balanced['share_to_fast']:.0%} to the fast replicas in 2 s, "
        f"p50 {balanced['p50_over_fast']:.2f}x the fast one's "
        f"(>= 90%, <= 1.2x: {'yes' if balanced['ok'] else 'NO'})"
        f"; hedging: p99 {out['hedging']['off']['p99_ms']} -> {out['hedging']['on']['p99_ms']}"
        f" ms ({out['hedging']['p99_cut']:.0%} cut) for "
        f"{out['hedging']['on']['extra_calls']:.1%} extra calls, "
        f"{out['hedging']['overload']['on']['extra_calls']:.1%} at 3x overload "
        f"(>= 40%, <= 10%, <= 2%: {'yes' if out['hedging']['ok'] else 'NO'})"
        f"; keepalive: a {out['keepalive']['first_token_s']} s first token through a "
        f"{out['keepalive']['idle_timeout_s']} s idle timeout {out['keepalive']['on']}"
        f" (without: {out['keepalive']['off']})"
        f"; fairness: the worst light key got {fair['light_worst_of_fair_share']:.0%}"
        f" of its fair share with keys taking turns (one key, first come first served: "
        f"{unfair:.0%}; >= 90%: {'yes' if fair['ok'] else 'NO'})"
        f"; priority: interactive p99 {fair['priority']['p99_over_alone']:.2f}x its unloaded "
        f"p99 while batch holds at most {fair['priority']['batch_share']:.0%} of the slots "
        f"(batch free to hold all: {fair['priority']['every slot']['p99_over_alone']:.2f}x; "
        f"<= 2x: {'yes' if fair['priority']['ok'] else 'NO'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
