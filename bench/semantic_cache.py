"""Semantic cache: quality, latency through the gateway, and lookup throughput.

    python bench/semantic_cache.py [--skip-quality] [--skip-latency] [--requests 400]

(a) Quality (bench/semantic_quality.py): the cache under its error bound (v3) at delta 0.02
    and 0.05 against static thresholds, as streams from a cold cache (QQP test, GPTCache
    paraphrases, chat prompts, rule-made hard negatives); served-wrong rate, recall,
    exploration, with yes/no per issue-29 target.
(b) Latency through the gateway (fake upstream, zero think time): exact hits, paraphrases
    of stored questions (all of them, and the semantic hits among them, told apart by the
    x-cache-similarity header) and misses (new questions, embedded, looked up, sent
    upstream, stored), p50/p99 ms, against the upstream direct; concurrency 1 and 32; memory
    and redis backends (a throwaway redis-stack-server), under the shipped lookup budget
    (cache.lookup_budget_ms) and error bound (a cold cache: paraphrases are misses there,
    each compared with its candidate after the answer). Side by side in the same run, on the memory backend (SETUPS):
    the semantic layer off (exact layer only); on without the budget (every miss waits for
    its lookup, as before the budget); and late hits served (an upstream that allows
    cancelling, as the local engine does, answering paraphrases after 200 ms; the static
    operating point there, max_error_rate = 0, so that paraphrases are hits). A miss's
    added p50 is its p50 minus the semantic-off gateway's. At concurrency 1, requests that
    embed are paced (PACE_S after each answer). The lookups by result, the requests past
    the budget and the late hits come from each gateway's /metrics.
(c) Lookup throughput: embeddings for 256 concurrent lookups through the engine thread with
    micro-batching vs. one at a time (batch size 1).

Prints one JSON object, then a one-line summary.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from processes import free_port, start_fake, start_gateway, stop, wait_ready
from semantic_quality import quality
from semantic_quality import summary as quality_summary

from gateway.policy import load_policy

DATA = ROOT.parent / "shared" / "data" / "semantic_cache"


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return round(s[min(len(s) - 1, max(0, round(q / 100 * len(s)) - 1))], 2)


async def timed(session: aiohttp.ClientSession, url: str, body: dict[str, Any],
                kinds: dict[str, list[float]] | None = None,
                headers: dict[str, str] | None = None) -> float:
    """Latency (ms); with ``kinds``, also filed under the response's cache outcome
    (``semantic_hit`` when x-cache-similarity is present, else the x-cache value)."""
    t0 = time.perf_counter()
    async with session.post(url, json=body, headers=headers) as r:
        await r.read()
        assert r.status == 200, r.status
        kind = "semantic_hit" if "x-cache-similarity" in r.headers else r.headers.get(
            "x-cache", "direct")
    ms = (time.perf_counter() - t0) * 1e3
    if kinds is not None:
        kinds.setdefault(kind, []).append(ms)
    return ms


async def load(session: aiohttp.ClientSession, url: str, bodies: list[dict[str, Any]],
               concurrency: int, kinds: dict[str, list[float]] | None = None,
               gap_s: float = 0.0, headers: dict[str, str] | None = None) -> list[float]:
    """Latencies (ms) of ``bodies`` sent by ``concurrency`` clients, each waiting ``gap_s``
    after each answer."""
    it = iter(bodies)
    out: list[float] = []

    async def worker() -> None:
        for body in it:
            out.append(await timed(session, url, body, kinds, headers))
            if gap_s:
                await asyncio.sleep(gap_s)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out


def body(q: str) -> dict[str, Any]:
    return {"model": "bench-model", "messages": [{"role": "user", "content": q}],
            "max_tokens": 64, "temperature": 0}


@dataclass(frozen=True)
class Setup:
    """One gateway measured: its backend, changes to the shipped policy's [cache] section,
    extra settings of its upstream, and what is asked of it."""

    backend: str = "memory"
    cache: tuple[tuple[str, str], ...] = ()
    upstream: str = ""
    sets: tuple[str, ...] = ("exact", "paraphrase", "miss", "direct")
    concurrency: tuple[int, ...] = (1, 32)
    #: Paraphrases: headers, and how many (None: all ``--requests``).
    headers: dict[str, str] | None = None
    paraphrases: int | None = None


#: Side by side in one run (see the module docstring).
SETUPS = {
    "memory": Setup(),
    "redis": Setup("redis", sets=("exact", "paraphrase", "miss")),
    "memory_semantic_off": Setup(cache=(("semantic", "false"),), sets=("exact", "miss")),
    "memory_no_budget": Setup(cache=(("lookup_budget_ms", "60000"),),
                              sets=("exact", "paraphrase", "miss")),
    "memory_late_hits_served": Setup(cache=(("max_error_rate", "0"),),
                                     upstream="cancel_on_late_hit = true",
                                     sets=("paraphrase",), concurrency=(1,),
                                     headers={"x-fake-ttft-ms": "200"}, paraphrases=100),
}
#: Concurrency 1: the pause after each request that embeds (s): behind a real model a
#: lookup ends before the answer; the fake upstream answers at once, and a lookup outlives
#: it, so without a pause each request would find the last one's embedding still running.
PACE_S = 0.03


def with_cache(policy: str, changes: tuple[tuple[str, str], ...]) -> str:
    """The policy with keys of its [cache] section set to other values."""
    head, rest = policy.split("\n[cache]\n", 1)
    section, sep, tail = rest.partition("\n[")
    for key, value in changes:
        section = re.sub(rf"^{key} = .*$", f"{key} = {value}", section, flags=re.MULTILINE)
    return f"{head}\n[cache]\n{section}{sep}{tail}"


def summary(name: str, times: list[float], kinds: dict[str, list[float]]) -> dict[str, Any]:
    """p50/p99 ms of one set (``exact_hit``, ``paraphrase`` with its semantic hits, ...)."""
    def p(label: str, values: list[float]) -> dict[str, float | None]:
        return {f"{label}_p50_ms": pct(values, 50) if values else None,
                f"{label}_p99_ms": pct(values, 99) if values else None}
    out = p({"exact": "exact_hit", "direct": "upstream_direct"}.get(name, name), times)
    if name == "paraphrase":
        sem = kinds.get("semantic_hit", [])
        out |= {"semantic_hits": len(sem), **p("semantic_hit", sem)}
    return out


async def one_client(session: aiohttp.ClientSession, urls: dict[str, str],
                     sets: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Concurrency 1, the gateways interleaved request by request (so the machine's other
    load falls on all of them alike), each paced after a request that embeds."""
    out: dict[str, dict[str, Any]] = {label: {} for label in urls}
    for name, bodies in sets.items():
        takers = {label: setup for label, setup in SETUPS.items()
                  if name in setup.sets and 1 in setup.concurrency}
        times: dict[str, list[float]] = {label: [] for label in takers}
        kinds: dict[str, dict[str, list[float]]] = {label: {} for label in takers}
        for i, b in enumerate(bodies):
            for label, setup in takers.items():
                if name == "paraphrase" and i >= (setup.paraphrases or len(bodies)):
                    continue
                headers = setup.headers if name == "paraphrase" else None
                times[label].append(await timed(session, urls["direct" if name == "direct"
                                                                else label], b,
                                                kinds[label], headers))
                if name in ("paraphrase", "miss"):
                    await asyncio.sleep(PACE_S)
        for label in takers:
            out[label] |= summary(name, times[label], kinds[label])
    return out


async def many_clients(session: aiohttp.ClientSession, url: str, direct: str, setup: Setup,
                       sets: dict[str, list[dict[str, Any]]], c: int) -> dict[str, Any]:
    """Concurrency ``c``, one gateway at a time (a load test)."""
    out: dict[str, Any] = {}
    for name, bodies in sets.items():
        if name not in setup.sets:
            continue
        kinds: dict[str, list[float]] = {}
        times = await load(session, direct if name == "direct" else url, bodies, c, kinds)
        out |= summary(name, times, kinds)
    return out


async def latency(requests: int) -> dict[str, Any]:
    rows = [orjson.loads(line) for line in (DATA / "gptcache_paraphrase_pairs.jsonl")
            .read_bytes().splitlines() if line.strip()]
    qqp = [orjson.loads(line)["text_a"] for line in (DATA / "qqp_pairs_test.jsonl")
           .read_bytes().splitlines()[:4000]]
    n = min(requests, len(rows), len(qqp) // 2)
    stored = [body(r["origin"]) for r in rows[:n]]
    sets = {"exact": stored, "paraphrase": [body(r["similar"]) for r in rows[:n]],
            "direct": stored}
    # The shipped policy without its routing section, whose tiers name models this
    # benchmark's gateway does not have, its semantic layer turned on (off by default).
    policy = (ROOT / "policies" / "default.toml").read_text().split("\n[routing]")[0]
    policy = policy.replace("\nsemantic = false\n", "\nsemantic = true\n")
    from gateway.testing.redis_server import RedisServer

    results: dict[str, Any] = {"lookup_budget_ms": load_policy(
        ROOT / "policies" / "default.toml").cache.lookup_budget_ms}
    fake_port = free_port()
    procs = [start_fake(fake_port)]
    redis = RedisServer().start()
    urls = {"direct": f"http://127.0.0.1:{fake_port}/v1/chat/completions"}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for label, setup in SETUPS.items():
                port = free_port()
                extra = f'[cache]\nenabled = true\nbackend = "{setup.backend}"\n' + (
                    f'redis_url = "{redis.url}"\n' if setup.backend == "redis" else "")
                (Path(tmp) / label).mkdir()
                procs.append(start_gateway(port, fake_port, Path(tmp) / label,
                                           with_cache(policy, setup.cache),
                                           upstream_extra=setup.upstream, config_extra=extra))
                urls[label] = f"http://127.0.0.1:{port}/v1/chat/completions"
            await wait_ready(urls["direct"].replace("/chat/completions", "/models"))
            async with aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(limit=0)) as session:
                for label, setup in SETUPS.items():
                    await wait_ready(urls[label].replace("/v1/chat/completions", "/readyz"))
                    if ("semantic", "false") not in setup.cache:
                        await _wait_semantic(session, urls[label])
                    # Filled by 8 clients, paced: past max_pending_embeddings the semantic
                    # layer sheds lookups, and an answer stored without its embedding can
                    # only hit exactly.
                    await load(session, urls[label], stored, 8, gap_s=0.1)
                await asyncio.sleep(0.5)  # stores land after the response
                c1 = await one_client(session, urls, {
                    **sets, "miss": [body(q) for q in qqp[:n]]})
                results |= {f"{label}_c1": out for label, out in c1.items() if out}
                for label, setup in SETUPS.items():
                    if 32 in setup.concurrency:
                        results[f"{label}_c32"] = await many_clients(
                            session, urls[label], urls["direct"], setup,
                            {**sets, "miss": [body(q) for q in qqp[n:2 * n]]}, 32)
                    async with session.get(urls[label].replace("/v1/chat/completions",
                                                               "/metrics")) as r:
                        text = await r.text()
                    results[f"{label}_counters"] = {
                        line.split(" ")[0].removeprefix("gateway_cache_"):
                            float(line.rsplit(" ", 1)[1])
                        for line in text.splitlines()
                        if line.startswith(("gateway_cache_lookups_total{",
                                            "gateway_cache_late_hits_total{",
                                            "gateway_cache_over_budget_total"))}
    finally:
        redis.stop()
        stop(procs)
    for c in (1, 32):
        off = results.get(f"memory_semantic_off_c{c}", {}).get("miss_p50_ms")
        if off is None:
            continue
        results[f"miss_added_p50_ms_c{c}"] = {
            "budget": round(results[f"memory_c{c}"]["miss_p50_ms"] - off, 2),
            "no_budget": round(results[f"memory_no_budget_c{c}"]["miss_p50_ms"] - off, 2)}
    return results


async def _wait_semantic(session: aiohttp.ClientSession, url: str) -> None:
    """The embedder loads in the background after start-up: wait until /readyz says the
    semantic layer is on."""
    ready = url.replace("/v1/chat/completions", "/readyz")
    for _ in range(1200):
        async with session.get(ready) as r:
            if (await r.json()).get("cache") == "semantic":
                return
        await asyncio.sleep(0.1)
    raise RuntimeError("the semantic layer never came up")


async def throughput() -> dict[str, Any]:
    from local_engine.async_engine import AsyncEngine
    from local_engine.embedder import Embedder

    rows = [orjson.loads(line)["text_b"] for line in (DATA / "qqp_pairs_test.jsonl")
            .read_bytes().splitlines()[:256]]
    embedder = Embedder.load()
    out = {}
    for name, batch in (("micro_batched", 64), ("one_at_a_time", 1)):
        engine = AsyncEngine(None, embedder, max_embed_batch=batch).start()
        await asyncio.gather(*(engine.embed([t]) for t in rows[:16]))  # warm-up
        t0 = time.perf_counter()
        await asyncio.gather(*(engine.embed([t]) for t in rows))
        out[f"{name}_lookups_per_s"] = round(len(rows) / (time.perf_counter() - t0), 1)
        engine.close()
    out["ratio"] = round(out["micro_batched_lookups_per_s"] / out["one_at_a_time_lookups_per_s"],
                         2)
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skip-quality", action="store_true")
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--requests", type=int, default=400)
    args = parser.parse_args()
    point = load_policy(ROOT / "policies" / "default.toml").cache.operating_point
    result: dict[str, Any] = {"operating_point": {"similarity": point.similarity,
                                                  "verifier": point.verifier}}
    if not args.skip_quality:
        result["quality"] = quality()
    result["throughput"] = await throughput()
    if not args.skip_latency:
        result["latency"] = await latency(args.requests)
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    line = (f"summary: {quality_summary(result['quality'])}; " if "quality" in result
            else "summary: ") + f"micro-batching {result['throughput']['ratio']}x"
    lat = result.get("latency", {})
    if lat:
        added, late = lat["miss_added_p50_ms_c1"], lat["memory_late_hits_served_c1"]
        line += (f"; c1 miss +{added['budget']} ms p50 with the semantic layer on (budget "
                 f"{lat['lookup_budget_ms']} ms; +{added['no_budget']} ms without it); "
                 f"semantic hit p50 {late['semantic_hit_p50_ms']} ms with late hits served "
                 f"({late['semantic_hits']} of {SETUPS['memory_late_hits_served'].paraphrases}"
                 f" paraphrases); upstream direct {lat['memory_c1']['upstream_direct_p50_ms']}"
                 " ms")
    for backend in ("memory", "redis"):
        c1 = lat.get(f"{backend}_c1")
        if c1:
            line += (f"; {backend} c1 p50 exact hit {c1['exact_hit_p50_ms']} / semantic hit "
                     f"{c1['semantic_hit_p50_ms']} / miss {c1['miss_p50_ms']} ms")
    print(line)


if __name__ == "__main__":
    asyncio.run(main())
