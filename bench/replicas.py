"""Routing across engine replicas, simulated: round_robin, least_load, prefix, prefix_precise.

    python bench/replicas.py [--replicas 4] [--utilization 0.6] [--seed 0]

A deterministic discrete-event simulation (simulated clock, seeded, no sleeping) of
``--replicas`` engine replicas behind the gateway's own routing policies
(:mod:`gateway.replicas.routing`, the classes the gateway runs, on the simulated clock).

Each replica is a fake engine: a prefix cache of ``--kv-tokens`` token slots in blocks of 16
tokens, LRU-evicted (as :mod:`local_engine.block_manager`; its block hashes are
:func:`local_engine.block_manager.block_hashes`, and every block it stores or evicts reaches
the gateways' ``prefix_precise`` index ``--events-lag-s`` after the prefill, as the engine's
KV events read every 0.1 s), and
a TTFT model: one prefill at a time, first come first served, each taking
``fixed_ms + uncached prompt tokens x prefill_ms_per_token``, so a request's TTFT is its wait
behind the replica's earlier prefills plus its own; then it decodes its output at
``decode_ms_per_token`` (a GPU's continuous batching: decodes do not hold prefills up). A
prompt is "tokenized" at 4 bytes a token over the canonical rendering
(:func:`gateway.replicas.prefix.render`).

Parameters measured from our engine on this machine (SmolLM2-135M, 2-core CPU; see
``ENGINE`` below for the figures and how they were taken): the prefill rate, the decode rate
at the calibrated batch, a request's fixed cost, and the KV capacity of the default
``kv_cache_mb = 1024``.

Traffic: the τ-bench airline conversations (test split; one request per assistant turn with
the history so far and the 14 tools; ``bench/agent_traces.py``), the next turn sent when the
previous answer is complete plus a tool/user gap (exponential, mean ``--agent-gap-s``); and
a chat mix: MT-Bench's 80 two-turn questions, each under one of 4 shared system prompts
(built from Vicuna-bench text), the second turn after a think time (mean ``--chat-gap-s``).
Conversations start as a Poisson process at the rate that keeps the replicas
``--utilization`` busy with prefills if every conversation stayed on one replica with an
unbounded cache.

Prints one JSON object (parameters, then per policy: prefix hit rate, TTFT p50/p99,
throughput, load imbalance), then a one-line summary with the targets for
``prefix_precise``: hit rate at least 0.9 of one unbounded replica's, TTFT p50 at least 2x
better than round robin, imbalance (max/mean requests per replica) at most 1.3.
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.agent_traces import load
from gateway.replicas.prefix import PrefixIndex, byte_keys, render
from gateway.replicas.routing import Replica, Router, RoutingName, make_router
from local_engine.block_manager import block_hashes

DATA = ROOT.parent / "shared" / "data"
POLICIES = ("round_robin", "least_load", "prefix", "prefix_precise")
BLOCK = 16  # tokens per KV block (EngineConfig.block_size)
BYTES_PER_TOKEN = 4
BLOCK_BYTES = 128  # the approximate index's block ([upstreams.X.pool] block_bytes default)

#: Our engine on this machine (SmolLM2-135M, bf16, 2 CPU cores shared with 3 other
#: engines, load ~5): ``python -m local_engine --no-embeddings``, then over loopback a
#: ~1,400-token prompt cold (TTFT 6.6-9.0 s: ~6 ms a prompt token; README's ~5, the
#: compression gate's learned 5.76) and again with a new last message (1,344-1,408 tokens
#: cached: 211-488 ms), and a 33-token prompt (124-224 ms): ``fixed_ms`` is a request's cost
#: before its uncached tokens. Decode: local_engine.calibrate's fp32 step at batch 16, 98 ms
#: (each running sequence gets a token a step). KV: the default kv_cache_mb = 1024 at
#: 30 layers x 2 x 3 KV heads x 64 x 4 bytes = 46,080 bytes a token (fp32; bf16 holds twice).
ENGINE = {
    "prefill_ms_per_token": 6.0,
    "decode_ms_per_token": 98.0,
    "fixed_ms": 150.0,
    "kv_tokens": 23_296,
}


@dataclass
class Request:
    conversation: int
    turn: int
    tokens: int
    token_keys: list[int]
    byte_keys: list[int]
    output_tokens: int


@dataclass
class Conversation:
    requests: list[Request]
    gap_s: float  # mean gap between an answer and the next turn
    start: float = 0.0


def _tokens(data: bytes) -> list[int]:
    """The fake engine's tokenizer: 4 bytes a token."""
    pad = data + b"\0" * (-len(data) % BYTES_PER_TOKEN)
    return [int.from_bytes(pad[i:i + 4], "little") for i in range(0, len(pad), 4)]


def _request(c: int, j: int, body: dict[str, Any], answer: dict[str, Any]) -> Request:
    data = render(body)
    tokens = _tokens(data)
    out = max(1, len(orjson.dumps(answer)) // BYTES_PER_TOKEN)
    return Request(c, j, len(tokens), block_hashes(tokens, BLOCK),
                   byte_keys(data, BLOCK_BYTES), out)


def agent_conversations(gap_s: float) -> list[Conversation]:
    conversations, tools = load("test")
    out = []
    for c, messages in enumerate(conversations):
        at = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
        reqs = [_request(c, j, {"messages": messages[:k], "tools": tools}, messages[k])
                for j, k in enumerate(at)]
        out.append(Conversation(reqs, gap_s))
    return out


def chat_conversations(gap_s: float, first: int, answer_tokens: int = 250) -> list[Conversation]:
    """MT-Bench's two-turn questions under 4 shared system prompts; the first answer is
    filler text of ``answer_tokens`` tokens (MT-Bench has no answers)."""
    rows = [orjson.loads(line) for line in
            (DATA / "prompts" / "mt_bench_questions.jsonl").read_bytes().splitlines()]
    vicuna = [orjson.loads(line)["turns"][0] for line in
              (DATA / "prompts" / "vicuna_bench_questions.jsonl").read_bytes().splitlines()]
    rng = random.Random(7)
    systems = []
    for team in ("support", "sales", "writing", "coding"):
        examples = rng.sample(vicuna, 20)
        systems.append(f"You are the {team} team's assistant. Answer in the style of these "
                       "example requests you have handled:\n- " + "\n- ".join(examples))
    out = []
    for i, row in enumerate(rows):
        system = {"role": "system", "content": systems[i % 4]}
        q1 = {"role": "user", "content": row["turns"][0]}
        a1 = {"role": "assistant",
              "content": " ".join(rng.sample(vicuna, 6))[:answer_tokens * BYTES_PER_TOKEN]}
        q2 = {"role": "user", "content": row["turns"][1]}
        c = first + i
        out.append(Conversation([_request(c, 0, {"messages": [system, q1]}, a1),
                                 _request(c, 1, {"messages": [system, q1, a1, q2]}, a1)],
                                gap_s))
    return out


@dataclass
class FakeEngine:
    """A replica: a prefix cache (LRU over block hashes) and one prefill at a time;
    ``states``: the replica as each gateway process sees it."""

    cache: PrefixIndex
    states: list[Replica]
    params: dict[str, float]
    queue: deque[tuple[float, Request, int]] = field(default_factory=deque)
    busy: bool = False
    running: int = 0
    routed: int = 0
    busy_s: float = 0.0
    evicted: list[int] = field(default_factory=list)

    def prefill(self, req: Request) -> tuple[float, int]:
        """Look the prompt up and store its blocks (``evicted``: the blocks that made room);
        returns (prefill seconds, prompt tokens served from the cache)."""
        matched = self.cache.match(req.token_keys)
        cached = min(matched * BLOCK, req.tokens - 1)
        self.evicted = self.cache.add(req.token_keys)
        p = self.params
        seconds = (p["fixed_ms"] + (req.tokens - cached) * p["prefill_ms_per_token"]) / 1000
        self.busy_s += seconds
        return seconds, cached

    def report(self, stored: list[int], evicted: list[int]) -> None:
        """Its KV events reach every gateway's precise index."""
        for state in self.states:
            state.held.add(stored)
            state.held.remove(evicted)

    def count(self, delta: int) -> None:
        """A request more or less on it: every gateway sees the total in its reports."""
        self.running += delta
        for state in self.states:
            state.reported = self.running


def simulate(policy: str, conversations: list[Conversation], replicas: int,
             params: dict[str, float], seed: int, gateways: int,
             events_lag_s: float) -> dict[str, Any]:
    """Every conversation through ``gateways`` gateway processes (requests spread over them
    in turn, as a load balancer in front of them would), each with its own router and its
    own view of the replicas; an engine's KV events reach them ``events_lag_s`` after the
    prefill that made them."""
    now = 0.0
    routers: list[Router] = [make_router(cast(RoutingName, policy), clock=lambda: now)
                             for _ in range(gateways)]
    kv_blocks = int(params["kv_tokens"]) // BLOCK
    approx_blocks = int(params["kv_tokens"]) * BYTES_PER_TOKEN // BLOCK_BYTES
    views = [[Replica(f"r{i}", approx_blocks) for i in range(replicas)]
             for _ in range(gateways)]
    engines = [FakeEngine(PrefixIndex(kv_blocks), [view[i] for view in views], params)
               for i in range(replicas)]
    rng = random.Random(seed)
    events: list[tuple[float, int, str, Any]] = []
    seq = 0

    def push(at: float, kind: str, payload: Any) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (at, seq, kind, payload))

    for conv in conversations:
        push(conv.start, "arrive", conv.requests[0])
    ttft: list[float] = []
    hit = total = arrivals = 0
    last_done = 0.0

    def start(engine: FakeEngine) -> None:
        nonlocal hit, total
        arrived, req, g = engine.queue.popleft()
        seconds, cached = engine.prefill(req)
        hit += cached
        total += req.tokens
        engine.busy = True
        push(now + seconds, "prefilled", (engine, arrived, req, g))
        # the engine registers the blocks as it computes them; gateways read them later
        push(now + seconds + events_lag_s, "report", (engine, req.token_keys, engine.evicted))

    while events:
        now, _, kind, payload = heapq.heappop(events)
        if kind == "arrive":
            req = payload
            g = arrivals % gateways
            arrivals += 1
            router, view = routers[g], views[g]
            keys = (req.token_keys if router.keys == "tokens"
                    else req.byte_keys if router.keys == "bytes" else [])
            chosen = router.order(view, keys)[0]
            engine = engines[view.index(chosen)]
            engine.routed += 1
            chosen.in_flight += 1
            engine.count(+1)
            engine.queue.append((now, req, g))
            if not engine.busy:
                start(engine)
        elif kind == "prefilled":
            engine, arrived, req, g = payload
            ttft.append((now - arrived) * 1000)
            push(now + req.output_tokens * params["decode_ms_per_token"] / 1000, "done",
                 (engine, req, g))
            engine.busy = False
            if engine.queue:
                start(engine)
        elif kind == "report":
            engine, stored, evicted = payload
            engine.report(stored, evicted)
        else:  # done
            engine, req, g = payload
            engine.states[g].in_flight -= 1
            engine.count(-1)
            last_done = now
            conv = conversations[req.conversation]
            if req.turn + 1 < len(conv.requests):
                push(now + rng.expovariate(1 / conv.gap_s), "arrive",
                     conv.requests[req.turn + 1])
    routed = [e.routed for e in engines]
    busy = [e.busy_s for e in engines]
    first = min(c.start for c in conversations)
    ttft.sort()
    return {
        "prefix_hit_rate": round(hit / total, 4),
        "ttft_p50_ms": round(statistics.median(ttft), 1),
        "ttft_p99_ms": round(ttft[int(0.99 * (len(ttft) - 1))], 1),
        "throughput_req_s": round(len(ttft) / (last_done - first), 4),
        "prefill_busy_s": round(sum(busy), 1),
        "requests_per_replica": routed,
        "imbalance": round(max(routed) / statistics.fmean(routed), 3),
        "busy_imbalance": round(max(busy) / statistics.fmean(busy), 3),
    }


def unbounded_hit_rate(conversations: list[Conversation]) -> float:
    """One replica, every request, a cache that never evicts (conversations in start order,
    each turn after the previous)."""
    cache = PrefixIndex()
    hit = total = 0
    for conv in sorted(conversations, key=lambda c: c.start):
        for req in conv.requests:
            hit += min(cache.match(req.token_keys) * BLOCK, req.tokens - 1)
            total += req.tokens
            cache.add(req.token_keys)
    return hit / total


def ideal_prefill_s(conversations: list[Conversation], params: dict[str, float]) -> float:
    """The prefill work if each conversation kept its own unbounded cache (s)."""
    work = 0.0
    for conv in conversations:
        cache = PrefixIndex()
        for req in conv.requests:
            cached = min(cache.match(req.token_keys) * BLOCK, req.tokens - 1)
            cache.add(req.token_keys)
            work += (params["fixed_ms"] + (req.tokens - cached)
                     * params["prefill_ms_per_token"]) / 1000
    return work


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--utilization", type=float, default=0.6)
    parser.add_argument("--agent-gap-s", type=float, default=1.0)
    parser.add_argument("--chat-gap-s", type=float, default=10.0)
    parser.add_argument("--kv-tokens", type=int, default=ENGINE["kv_tokens"])
    parser.add_argument("--gateways", type=int, default=2,
                        help="gateway processes, requests spread over them in turn (the "
                             "k8s base runs 2)")
    parser.add_argument("--events-lag-s", type=float, default=0.1,
                        help="KV events reach the gateways this long after the prefill "
                             "(the pool reads /kv_events every 0.1 s)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    params = {**ENGINE, "kv_tokens": args.kv_tokens}
    agents = agent_conversations(args.agent_gap_s)
    conversations = agents + chat_conversations(args.chat_gap_s, len(agents))
    work = ideal_prefill_s(conversations, params)
    rate = args.replicas * args.utilization * len(conversations) / work  # conversations/s
    rng = random.Random(args.seed)
    order = list(range(len(conversations)))
    rng.shuffle(order)
    at = 0.0
    for c in order:
        conversations[c].start = at
        at += rng.expovariate(rate)
    results = {p: simulate(p, conversations, args.replicas, params, args.seed,
                            args.gateways, args.events_lag_s)
               for p in POLICIES}
    unbounded = unbounded_hit_rate(conversations)
    best, rr = results["prefix_precise"], results["round_robin"]
    targets = {
        "hit_rate_vs_unbounded": round(best["prefix_hit_rate"] / unbounded, 3),
        "ttft_p50_speedup_vs_round_robin": round(rr["ttft_p50_ms"] / best["ttft_p50_ms"], 2),
        "imbalance": best["imbalance"],
    }
    met = {"hit_rate_vs_unbounded": targets["hit_rate_vs_unbounded"] >= 0.9,
           "ttft_p50_speedup_vs_round_robin": targets["ttft_p50_speedup_vs_round_robin"] >= 2,
           "imbalance": targets["imbalance"] <= 1.3}
    requests = sum(len(c.requests) for c in conversations)
    doc = {"params": {**params, "block_tokens": BLOCK, "bytes_per_token": BYTES_PER_TOKEN,
                      "approx_block_bytes": BLOCK_BYTES, "replicas": args.replicas,
                      "gateways": args.gateways, "events_lag_s": args.events_lag_s,
                      "utilization": args.utilization, "conversations_per_s": round(rate, 4),
                      "conversations": len(conversations), "requests": requests,
                      "seed": args.seed},
           "unbounded_hit_rate": round(unbounded, 4), "policies": results,
           "targets": targets, "met": met}
    print(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())
    cells = " | ".join(f"{p}: hit {r['prefix_hit_rate']:.3f} p50 {r['ttft_p50_ms']:.0f} ms "
                       f"p99 {r['ttft_p99_ms']:.0f} ms imb {r['imbalance']:.2f}"
                       for p, r in results.items())
    verdict = "all targets met" if all(met.values()) else \
        "MISSED: " + ", ".join(k for k, ok in met.items() if not ok)
    print(f"{cells} || precise/unbounded hit {targets['hit_rate_vs_unbounded']}, "
          f"p50 {targets['ttft_p50_speedup_vs_round_robin']}x vs RR, imbalance "
          f"{targets['imbalance']}: {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
