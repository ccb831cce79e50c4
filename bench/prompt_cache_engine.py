"""The prompt_cache stage against the real local engine: its prefix cache, and TTFT.

A few τ-bench airline test conversations (the volatile variant: the request's own time in
the system prompt) replayed turn by turn through the gateway as ``make run`` serves it
(``gateway.example.toml``: the local engine with SmolLM2-135M-Instruct), once with the
``prompt_cache`` stage off and once on, each on a freshly started gateway and engine (so
neither inherits the other's prefix cache). The response cache is off in both, so every
request reaches the engine. The engine renders no tools (its chat template has none), so
the tools are left out of the requests; ``max_model_len`` is raised to fit the
conversations (SmolLM2 takes 8,192 tokens).

For each setting it prints the engine's cached share of prompt tokens (its usage's
``prompt_tokens_details.cached_tokens``) and TTFT p50/mean, then their ratio, as JSON and a
summary line starting ``prompt_cache_engine:``.

    python bench/prompt_cache_engine.py [--conversations 2] [--turns 4] [--max-tokens 8]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from agent_traces import load, openai_body, schedule
from processes import ROOT, free_port, stop, wait_ready

POLICY = {"off": 'version = "engine-off"\n[cache]\nenabled = false\n'
                 '[prompt_cache]\nenabled = false\n',
          "on": 'version = "engine-on"\n[cache]\nenabled = false\n'}


def start(setting: str, workdir: Path, port: int, max_model_len: int) -> subprocess.Popen[bytes]:
    """``gateway serve`` with make run's config, but for the port, the policy (the stage on
    or off, the response cache off) and the engine's max_model_len."""
    config = (ROOT / "gateway.example.toml").read_text()
    config = re.sub(r"(?m)^port = \d+", f"port = {port}", config, count=1)
    config = re.sub(r'(?m)^policy = "[^"]*"', 'policy = "policy.toml"', config, count=1)
    config = re.sub(r"(?m)^max_model_len = \d+", f"max_model_len = {max_model_len}", config)
    folder = workdir / setting
    folder.mkdir()
    (folder / "policy.toml").write_text(POLICY[setting])
    (folder / "gateway.toml").write_text(config)
    return subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--config",
                             str(folder / "gateway.toml")], cwd=ROOT, stdout=subprocess.DEVNULL)


async def replay(url: str, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Send each body in turn, streaming; TTFT (ms) and the usage of each."""
    out = []
    async with aiohttp.ClientSession() as session:
        for body in bodies:
            started = time.perf_counter()
            ttft = None
            usage: dict[str, Any] = {}
            async with session.post(url, json={**body, "stream": True,
                                               "stream_options": {"include_usage": True}}) as r:
                if r.status != 200:
                    raise RuntimeError(f"{r.status}: {(await r.read())[:300]!r}")
                async for line in r.content:
                    if ttft is None and line.startswith(b"data: {"):
                        ttft = (time.perf_counter() - started) * 1000
                    if line.startswith(b'data: {') and b'"usage":{' in line:
                        usage = orjson.loads(line[6:]).get("usage") or usage
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            out.append({"ttft_ms": round(ttft or 0.0, 1), "prompt_tokens":
                        usage.get("prompt_tokens", 0), "cached_tokens": cached})
    return out


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    prompt = sum(r["prompt_tokens"] for r in rows)
    cached = sum(r["cached_tokens"] for r in rows)
    ttfts = [r["ttft_ms"] for r in rows]
    return {"requests": len(rows), "prompt_tokens": prompt, "cached_tokens": cached,
            "cached_share": round(cached / prompt, 3) if prompt else 0.0,
            "ttft_p50_ms": round(statistics.median(ttfts), 1),
            "ttft_mean_ms": round(statistics.fmean(ttfts), 1), "per_request": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conversations", type=int, default=2)
    parser.add_argument("--turns", type=int, default=4, help="assistant turns per conversation")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--max-model-len", type=int, default=8192)
    args = parser.parse_args()
    conversations, _ = load("test", args.conversations)
    turns = [t for t in schedule(conversations, turn_s=5.0, stagger_s=30.0)
             if t.index < args.turns]
    bodies = [openai_body(t, [], "volatile", "smollm2", args.max_tokens) for t in turns]
    for body in bodies:
        del body["tools"]
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for setting in ("off", "on"):
            port = free_port()
            proc = start(setting, Path(tmp), port, args.max_model_len)
            try:
                base = f"http://127.0.0.1:{port}"

                async def go(base: str = base) -> list[dict[str, Any]]:
                    await wait_ready(base + "/healthz")
                    await wait_ready(base + "/readyz", timeout=600)
                    return await replay(base + "/v1/chat/completions", bodies)

                results[setting] = summarise(asyncio.run(go()))
            finally:
                stop([proc], timeout=30)
    off, on = results["off"], results["on"]
    doc = {"bench": "prompt_cache_engine", "cpus": os.cpu_count(),
           "conversations": args.conversations, "turns": args.turns, "results": results,
           "ttft_p50_on_over_off": round(on["ttft_p50_ms"] / off["ttft_p50_ms"], 3)}
    print(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())
    print(f"prompt_cache_engine: {on['requests']} requests; cached share of prompt tokens "
          f"off {off['cached_share']:.1%} on {on['cached_share']:.1%}; TTFT p50 off "
          f"{off['ttft_p50_ms']} ms on {on['ttft_p50_ms']} ms "
          f"(on/off {doc['ttft_p50_on_over_off']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
