"""Provider prompt caching through the gateway, on a real agent workload, side by side.

The τ-bench airline TEST conversations (:mod:`agent_traces`): one request per assistant turn
with the history so far and the 14 tools (``max_tokens`` short), replayed in simulated time
(``--turn-seconds`` between a conversation's turns, ``--stagger-seconds`` between
conversation starts), sequentially, through a gateway to the fake upstreams simulating the
providers' prompt caches (:mod:`gateway.testing.cache_sim`; each cell in its own cache scope,
the simulated time in ``x-fake-clock``). Processes: the fake OpenAI upstream, the fake
Anthropic upstream, a gateway with ``[prompt_cache] enabled = false`` and one with the
default policy, each logging its request lines to a file.

Cells, per provider and variant (``recorded``: the conversations as recorded; ``volatile``:
the request's own time in the system prompt and the tools in a different order on every
request):

- ``none``: the client marks nothing, the stage is off;
- ``markers``: LiteLLM-style fixed markers (the client marks the system prompt and the last
  message with ``cache_control``), the stage off; Anthropic only (OpenAI has no markers);
- ``stage``: the client marks nothing, the default policy (the stage on, once it exists).

Anthropic: the client speaks /v1/messages (each OpenAI request converted by
``anthropic_request``), so the gateway forwards it natively (byte for byte with the stage off)
to model ``claude-sonnet-4-6``. OpenAI: chat completions to ``gpt-5`` on an OpenAI-compatible
upstream.

Per cell it prints the cached share of input tokens (from the answers' usage, and again from
the gateway's log via ``gateway prompt-cache report``'s code), the theoretical maximum (each
request reusing at most the previous request of its conversation: the longest common prefix,
computed on the recorded variant, so volatile parts count as movable, under the same
minimum-length rule), their ratio, and the input cost against no caching (Anthropic: reads
0.1x, writes 1.25x for 5m and 2x for 1h; OpenAI: cached 0.1x for gpt-5, 0.5x for gpt-4o,
shown too). Then the stage's own cost on 7-9k-token prompts: its work timed in-process
(reading the body, shaping it, remembering it; p99, the figure checked) and the gateway's
``overhead_ms`` p50/p99 with the stage against without it (the whole gateway, machine noise
included).

Targets (issue 14): stage >= 90% of the maximum on both variants for both providers; input
cost <= 30% of uncached on the recorded conversations (stage); stage <= 1 ms p99.

    python bench/prompt_cache.py [--conversations N] [--providers anthropic openai]
                                 [--turn-seconds 5] [--stagger-seconds 30]

Prints a JSON document, then one summary line starting ``prompt_cache:``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import uvloop
from agent_traces import DATA, Turn, anthropic_body, load, max_cached, openai_body, schedule
from processes import free_port, start_fake, start_fake_anthropic, start_gateway, stop, wait_ready
from stage_cost import overhead_by_cell, shape_timing

from gateway.policy import PipelinePolicy, Policy
from gateway.testing.cache_sim import Tokenizer, openai_prompt
from gateway.tools.prompt_cache_report import multipliers, read_log, summarize

MODELS = {"openai": ("bench-gpt", "gpt-5"), "anthropic": ("bench-claude", "claude-sonnet-4-6")}
PATHS = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages"}
SETUPS = {"openai": ("none", "stage"), "anthropic": ("none", "markers", "stage")}
VARIANTS = ("recorded", "volatile")
#: Anthropic's input-price multipliers: cache reads, 5-minute writes, 1-hour writes.
ANTHROPIC_READ, ANTHROPIC_WRITE_5M, ANTHROPIC_WRITE_1H = 0.1, 1.25, 2.0
TARGET_SHARE_OF_MAX, TARGET_COST, TARGET_STAGE_P99_MS = 0.9, 0.3, 1.0
CONFIG = """
[models."bench-gpt"]
targets = [{{ upstream = "fake", model = "gpt-5" }}]
[upstreams.claude]
type = "anthropic"
forward_headers = ["x-fake-*"]
base_url = "http://127.0.0.1:{port}"
api_key_env = "BENCH_ANTHROPIC_KEY"
[models."bench-claude"]
targets = [{{ upstream = "claude", model = "claude-sonnet-4-6" }}]
"""


def stage_state() -> dict[str, bool]:
    """Whether the policy knows ``[prompt_cache]`` and the default pipeline runs the stage."""
    known = "prompt_cache" in {f.name for f in dataclasses.fields(Policy)}
    return {"policy_section": known, "in_default_pipeline": "prompt_cache" in
            PipelinePolicy().stages}


@dataclasses.dataclass
class Totals:
    """Input tokens of a cell's requests, as the upstream's usage reported them."""

    requests: int = 0
    errors: int = 0
    input: int = 0
    read: int = 0
    written_5m: int = 0
    written_1h: int = 0

    def add(self, api: str, usage: dict[str, Any]) -> None:
        self.requests += 1
        if api == "anthropic":
            read = usage.get("cache_read_input_tokens") or 0
            written = usage.get("cache_creation_input_tokens") or 0
            by_ttl = usage.get("cache_creation") or {}
            hour = by_ttl.get("ephemeral_1h_input_tokens") or 0
            self.input += usage["input_tokens"] + read + written
            self.read += read
            self.written_1h += hour
            self.written_5m += written - hour
        else:
            self.input += usage["prompt_tokens"]
            self.read += (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0

    def relative_cost(self, api: str, read_x: float) -> float:
        """Input cost over the cost without caching."""
        written = self.written_5m + self.written_1h
        cost = self.input - self.read - written + self.read * read_x
        if api == "anthropic":
            cost += self.written_5m * ANTHROPIC_WRITE_5M + self.written_1h * ANTHROPIC_WRITE_1H
        return cost / self.input if self.input else 1.0


async def send(session: aiohttp.ClientSession, url: str, api: str, cell: str, i: int,
               turn: Turn, body: dict[str, Any], totals: Totals) -> None:
    """One request of a cell, its usage added to ``totals``."""
    headers = {"content-type": "application/json", "x-fake-tokens": "4",
               "x-fake-cache-scope": cell, "x-fake-clock": f"{turn.at:.3f}",
               "x-request-id": f"{cell}/{i}"}
    if api == "anthropic":
        headers |= {"x-api-key": "bench", "anthropic-version": "2023-06-01"}
    async with session.post(url, data=orjson.dumps(body), headers=headers) as r:
        answer = await r.read()
    if r.status != 200:
        totals.errors += 1
        if totals.errors <= 3:
            print(f"{cell}: HTTP {r.status}: {answer[:300]!r}", file=sys.stderr)
        return
    totals.add(api, orjson.loads(answer)["usage"])


def build(api: str, variant: str, setup: str, tools: list[dict[str, Any]],
          max_tokens: int, time_format: str) -> Callable[[Turn], dict[str, Any]]:
    """What the client sends for a turn in a cell."""
    model = MODELS[api][0]
    if api == "anthropic":
        return partial(anthropic_body, tools=tools, variant=variant, setup=setup, model=model,
                       max_tokens=max_tokens, time_format=time_format)
    return partial(openai_body, tools=tools, variant=variant, model=model,
                   max_tokens=max_tokens, time_format=time_format)


async def bench(args: argparse.Namespace, urls: dict[str, str], turns: list[Turn],
                tools: list[dict[str, Any]]) -> dict[str, Totals]:
    """Every cell's totals. A provider's setups go turn by turn side by side (each in its own
    cache scope, so each cell's cache sees its requests alone and in order), so that drift in
    the machine's speed hits the gateways' overheads alike."""
    out: dict[str, Totals] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        for api in args.providers:
            for variant in VARIANTS:
                started = time.perf_counter()
                cells = {setup: f"{api}/{variant}/{setup}" for setup in SETUPS[api]}
                bodies = {setup: build(api, variant, setup, tools, args.max_tokens,
                                       args.time_format) for setup in cells}
                out |= {cell: Totals() for cell in cells.values()}
                for i, turn in enumerate(turns):
                    for setup, cell in cells.items():
                        url = urls["on" if setup == "stage" else "off"] + PATHS[api]
                        await send(session, url, api, cell, i, turn, bodies[setup](turn),
                                   out[cell])
                print(f"{api}/{variant}: {len(turns)} turns x {len(cells)} setups in "
                      f"{time.perf_counter() - started:.1f} s", file=sys.stderr)
    return out


def results(args: argparse.Namespace, cells: dict[str, Totals], turns: list[Turn],
            tools: list[dict[str, Any]], logs: dict[str, list[dict[str, Any]]]
            ) -> dict[str, Any]:
    tokenizer = Tokenizer()
    out: dict[str, Any] = {}
    for api in args.providers:
        recorded = build(api, "recorded", "none", tools, args.max_tokens, args.time_format)
        most = max_cached(turns, recorded, api, MODELS[api][1], tokenizer)
        max_share = most.conversation / most.total if most.total else 0.0
        anywhere = most.anywhere / most.total if most.total else 0.0
        read_x = ANTHROPIC_READ if api == "anthropic" else multipliers(MODELS[api][1])[0]
        for variant in VARIANTS:
            for setup in SETUPS[api]:
                cell = f"{api}/{variant}/{setup}"
                t = cells[cell]
                share = t.read / t.input if t.input else 0.0
                row: dict[str, Any] = {
                    **dataclasses.asdict(t), "cached_share": round(share, 4),
                    "max_share": round(max_share, 4), "max_share_anywhere": round(anywhere, 4),
                    "of_max": round(share / max_share, 4) if max_share else None,
                    "relative_cost": round(t.relative_cost(api, read_x), 4)}
                if api == "openai":
                    row["relative_cost_at_0.5x"] = round(t.relative_cost(api, 0.5), 4)
                logged = summarize(logs.get(cell, [])).get("all")
                row["log_cached_share"] = logged.as_dict()["cached_share"] if logged else None
                out[cell] = row
    return out


def stage_timing(args: argparse.Namespace, turns: list[Turn],
                 tools: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The stage's own work in-process (stage_cost.shape_timing) on the volatile variant's
    bodies, each API to itself, timed on the 7-9k-token prompts."""
    tokenizer = Tokenizer()
    recorded = build("openai", "recorded", "none", tools, args.max_tokens, args.time_format)
    sized = [7_000 <= len(openai_prompt(recorded(t), tokenizer)) // 4 <= 9_000 for t in turns]
    bodies = {}
    for api in args.providers:
        body = build(api, "volatile", "none", tools, args.max_tokens, args.time_format)
        bodies[api] = [{**body(turn), "model": MODELS[api][1]} for turn in turns]
    return shape_timing(bodies, sized)


def acceptance(rows: dict[str, Any], cost: dict[str, Any]) -> dict[str, Any]:
    checks: dict[str, Any] = {}
    for cell, row in rows.items():
        api, variant, setup = cell.split("/")
        if setup != "stage":
            continue
        of_max = row["of_max"] or 0.0
        checks[f"{api}_{variant}_of_max"] = {"of_max": of_max, "min": TARGET_SHARE_OF_MAX,
                                             "holds": of_max >= TARGET_SHARE_OF_MAX}
        if variant == "recorded":
            checks[f"{api}_recorded_cost"] = {"relative_cost": row["relative_cost"],
                                              "max": TARGET_COST,
                                              "holds": row["relative_cost"] <= TARGET_COST}
    p99 = cost.get("shape_p99_ms")
    if p99 is None:  # no in-process function: the gateway's added overhead p99
        p99 = max((c["added_p99_ms"] for c in cost["overhead"].values()), default=None)
    checks["stage_p99"] = {"p99_ms": p99, "max_ms": TARGET_STAGE_P99_MS,
                           "holds": p99 is not None and p99 <= TARGET_STAGE_P99_MS}
    checks["all_hold"] = all(c["holds"] for c in checks.values())
    return checks


def summary_line(rows: dict[str, Any], checks: dict[str, Any], cost: dict[str, Any]) -> str:
    def yn(ok: bool) -> str:
        return "yes" if ok else "NO"

    parts = []
    for cell in rows:
        api, variant, setup = cell.split("/")
        if setup != "stage":
            continue
        shares = " ".join(f"{s} {rows[f'{api}/{variant}/{s}']['cached_share']:.1%}"
                          for s in SETUPS[api])
        of_max = checks[f"{api}_{variant}_of_max"]
        part = (f"{api} {variant}: cached {shares} (max {rows[cell]['max_share']:.1%}; stage "
                f"{of_max['of_max']:.1%} of max >= 90%: {yn(of_max['holds'])})")
        if variant == "recorded":
            c = checks[f"{api}_recorded_cost"]
            part += (f", stage input cost {c['relative_cost']:.1%} of uncached <= 30%: "
                     f"{yn(c['holds'])}")
        parts.append(part)
    p = checks["stage_p99"]
    how = "shape p99" if cost.get("shape_p99_ms") is not None else "added overhead p99"
    value = "n/a" if p["p99_ms"] is None else f"{p['p99_ms']:.3f} ms"
    parts.append(f"stage cost ({how}, ~8k-token prompts) {value} <= 1 ms: {yn(p['holds'])}")
    if not cost["stage"]["in_default_pipeline"]:
        parts.append("(no prompt_cache stage in the default pipeline: stage = none)")
    parts.append(f"all targets: {yn(checks['all_hold'])}")
    return "prompt_cache: " + "; ".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conversations", type=int, help="the first N test conversations")
    parser.add_argument("--providers", nargs="+", choices=("anthropic", "openai"),
                        default=["anthropic", "openai"])
    parser.add_argument("--turn-seconds", type=float, default=5.0)
    parser.add_argument("--stagger-seconds", type=float, default=30.0)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--data", type=Path, default=DATA,
                        help="the agent_traces folder (default: ../shared/data/agent_traces)")
    parser.add_argument("--time-format", default="%Y-%m-%d %H:%M:%S EST",
                        help="strftime format of the volatile variant's time")
    args = parser.parse_args()
    conversations, tools = load("test", args.conversations, args.data)
    turns = schedule(conversations, args.turn_seconds, args.stagger_seconds)
    state = stage_state()
    off_policy = 'version = "bench-off"\n' + (
        "[prompt_cache]\nenabled = false\n" if state["policy_section"] else "")
    openai_port, anthropic_port = free_port(), free_port()
    ports = {"off": free_port(), "on": free_port()}
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        logs = {name: Path(tmp) / f"gateway-{name}.log" for name in ports}
        try:
            procs.append(start_fake(openai_port, simulate_cache=True))
            procs.append(start_fake_anthropic(anthropic_port, simulate_cache=True))
            os.environ["BENCH_ANTHROPIC_KEY"] = "bench"
            config = CONFIG.format(port=anthropic_port)
            for name, policy in (("off", off_policy), ("on", 'version = "bench-on"\n')):
                procs.append(start_gateway(ports[name], openai_port, Path(tmp), policy,
                                           config_extra=config, log=logs[name]))
            urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}

            async def go() -> dict[str, Totals]:
                await wait_ready(f"http://127.0.0.1:{openai_port}/v1/models")
                for url in urls.values():
                    await wait_ready(url + "/healthz")
                return await bench(args, urls, turns, tools)

            cells = uvloop.run(go())
            time.sleep(0.5)  # the gateways flush their log lines every 0.2 s
        finally:
            stop(procs)
        lines = [r for log in logs.values() for r in read_log(log.read_bytes().splitlines())]
    by_cell: dict[str, list[dict[str, Any]]] = {}
    for record in lines:
        by_cell.setdefault(str(record.get("request_id", "")).rsplit("/", 1)[0], []).append(record)
    rows = results(args, cells, turns, tools, by_cell)
    timing = stage_timing(args, turns, tools)
    cost = {"stage": state, "overhead": overhead_by_cell(by_cell, 7_000, 9_000),
            "shape": timing, "shape_p99_ms": max(
                (row["p99_ms"] for row in timing.values()), default=None) if timing else None}
    checks = acceptance(rows, cost)
    doc = {"bench": "prompt_cache", "conversations": len(conversations), "requests": len(turns),
           "turn_seconds": args.turn_seconds, "stagger_seconds": args.stagger_seconds,
           "models": {api: MODELS[api][1] for api in args.providers}, "cells": rows,
           "stage_cost": cost, "acceptance": checks}
    print(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())
    print(summary_line(rows, checks, cost))
    return 0


if __name__ == "__main__":
    sys.exit(main())
