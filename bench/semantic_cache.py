"""Semantic cache: quality, latency through the gateway, and lookup throughput.

    python bench/semantic_cache.py [--skip-latency] [--requests 400]

(a) Quality (bench/semantic_quality.py): verifier v3 (cross-encoder, at the operating point
    shipped in policies/default.toml), v2 (the MLP, at its shipped point) and static cosine,
    side by side on qqp_pairs_test (precision, recall), the 999 GPTCache paraphrases
    (correct / wrong / missed; GPTCache published 804 / 77 / 118 at its threshold 0.9) and
    hard negatives made by rule from the QQP test texts (share rejected), with yes/no per
    issue-17 target.
(b) Latency through the gateway (fake upstream, zero think time): exact hits, paraphrases
    of stored questions (all of them, and the semantic hits among them, told apart by the
    x-cache-similarity header) and misses (new questions, embedded, looked up, sent
    upstream, stored), p50/p99 ms, against the upstream direct; concurrency 1 and 32; memory
    and redis backends (a throwaway redis-stack-server).
(c) Lookup throughput: embeddings for 256 concurrent lookups through the engine thread with
    micro-batching vs. one at a time (batch size 1).

Prints one JSON object, then a one-line summary.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from processes import free_port, start_fake, start_gateway, wait_ready

from semantic_quality import quality, summary

from gateway.policy import load_policy

DATA = ROOT.parent / "shared" / "data" / "semantic_cache"


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return round(s[min(len(s) - 1, max(0, round(q / 100 * len(s)) - 1))], 2)


async def timed(session: aiohttp.ClientSession, url: str, body: dict[str, Any],
                kinds: dict[str, list[float]] | None = None) -> float:
    """Latency (ms); with ``kinds``, also filed under the response's cache outcome
    (``semantic_hit`` when x-cache-similarity is present, else the x-cache value)."""
    t0 = time.perf_counter()
    async with session.post(url, json=body) as r:
        await r.read()
        assert r.status == 200, r.status
        kind = "semantic_hit" if "x-cache-similarity" in r.headers else r.headers.get(
            "x-cache", "direct")
    ms = (time.perf_counter() - t0) * 1e3
    if kinds is not None:
        kinds.setdefault(kind, []).append(ms)
    return ms


async def load(session: aiohttp.ClientSession, url: str, bodies: list[dict[str, Any]],
               concurrency: int, kinds: dict[str, list[float]] | None = None) -> list[float]:
    it = iter(bodies)
    out: list[float] = []

    async def worker() -> None:
        for body in it:
            out.append(await timed(session, url, body, kinds))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out


def body(q: str) -> dict[str, Any]:
    return {"model": "bench-model", "messages": [{"role": "user", "content": q}],
            "max_tokens": 64, "temperature": 0}


async def latency(requests: int) -> dict[str, Any]:
    rows = [orjson.loads(line) for line in (DATA / "gptcache_paraphrase_pairs.jsonl")
            .read_bytes().splitlines() if line.strip()]
    qqp = [orjson.loads(line)["text_a"] for line in (DATA / "qqp_pairs_test.jsonl")
           .read_bytes().splitlines()[:4000]]
    # The shipped policy without its routing section, whose tiers name models this
    # benchmark's gateway does not have.
    policy = (ROOT / "policies" / "default.toml").read_text().split("\n[routing]")[0]
    from gateway.testing.redis_server import RedisServer

    results: dict[str, Any] = {}
    fake_port = free_port()
    fake = start_fake(fake_port)
    redis = RedisServer().start()
    try:
        await wait_ready(f"http://127.0.0.1:{fake_port}/v1/models")
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            direct = f"http://127.0.0.1:{fake_port}/v1/chat/completions"
            for backend in ("memory", "redis"):
                port = free_port()
                extra = f'[cache]\nenabled = true\nbackend = "{backend}"\n' + (
                    f'redis_url = "{redis.url}"\n' if backend == "redis" else "")
                with tempfile.TemporaryDirectory() as tmp:
                    gw = start_gateway(port, fake_port, Path(tmp), policy, config_extra=extra)
                    try:
                        await wait_ready(f"http://127.0.0.1:{port}/readyz")
                        url = f"http://127.0.0.1:{port}/v1/chat/completions"
                        await _wait_semantic(session, url)
                        n = min(requests, len(rows))
                        stored = [body(r["origin"]) for r in rows[:n]]
                        await load(session, url, stored, 8)  # fill the cache
                        await asyncio.sleep(0.5)  # stores land after the response
                        fresh = iter(qqp)
                        for c in (1, 32):
                            exact = await load(session, url, stored, c)
                            kinds: dict[str, list[float]] = {}
                            para = await load(session, url, [body(r["similar"])
                                                             for r in rows[:n]], c, kinds)
                            sem = kinds.get("semantic_hit", [])
                            misses = await load(session, url, [body(next(fresh)) for _ in
                                                               range(n)], c)
                            base = await load(session, direct, stored, c)
                            results[f"{backend}_c{c}"] = {
                                "exact_hit_p50_ms": pct(exact, 50),
                                "exact_hit_p99_ms": pct(exact, 99),
                                "paraphrase_p50_ms": pct(para, 50),
                                "paraphrase_p99_ms": pct(para, 99),
                                "semantic_hits": len(sem),
                                "semantic_hit_p50_ms": pct(sem, 50) if sem else None,
                                "semantic_hit_p99_ms": pct(sem, 99) if sem else None,
                                "miss_p50_ms": pct(misses, 50), "miss_p99_ms": pct(misses, 99),
                                "upstream_direct_p50_ms": pct(base, 50),
                                "upstream_direct_p99_ms": pct(base, 99)}
                        async with session.get(f"http://127.0.0.1:{port}/metrics") as r:
                            text = await r.text()
                        results[f"{backend}_lookups"] = {
                            line.split("{")[1].split("}")[0]: float(line.rsplit(" ", 1)[1])
                            for line in text.splitlines()
                            if line.startswith("gateway_cache_lookups_total{")}
                    finally:
                        gw.terminate()
                        gw.wait()
    finally:
        redis.stop()
        fake.terminate()
        fake.wait()
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
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--requests", type=int, default=400)
    args = parser.parse_args()
    point = load_policy(ROOT / "policies" / "default.toml").cache.operating_point
    result: dict[str, Any] = {"operating_point": {"similarity": point.similarity,
                                                  "verifier": point.verifier}}
    result["quality"] = quality(load_policy(ROOT / "policies" / "default.toml").cache)
    result["throughput"] = await throughput()
    if not args.skip_latency:
        result["latency"] = await latency(args.requests)
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    line = (f"summary: {summary(result['quality'])}; "
            f"micro-batching {result['throughput']['ratio']}x")
    for backend in ("memory", "redis"):
        lat = result.get("latency", {}).get(f"{backend}_c1")
        if lat:
            line += (f"; {backend} c1 hit p50 exact {lat['exact_hit_p50_ms']} / semantic "
                     f"{lat['semantic_hit_p50_ms']} ms, miss {lat['miss_p50_ms']} ms vs direct "
                     f"{lat['upstream_direct_p50_ms']} ms")
    print(line)


if __name__ == "__main__":
    asyncio.run(main())
