"""Part 6 of bench/engine.py (``--structured``): what grammar-constrained decoding costs.

Throughput: the same chat prompts (vicuna_bench_questions.jsonl, asked for a JSON list of
people), greedy, exactly ``--structured-max-tokens`` output tokens each (EOS ignored), at
batch 1 and 32, free vs. constrained by a JSON Schema (an array of person objects, with
no bounds so that the grammar rarely ends before the limit: ``grammar_ended`` counts the
sequences whose grammar did, which then only masks to EOS). Speculation is off in both
engines, so the figure is the mask's own cost (the tokens a grammar forces would otherwise
come as drafts, faster than free decoding). Free and constrained alternate round by round
(``--structured-rounds``, medians), so that drift in the machine's speed hits both alike.

Compilation: the τ-bench airline tools (14 functions, ../shared/data/agent_traces) as the
engine compiles them for ``tool_choice`` auto, required and each function named, each in a
fresh cache (a miss every time): p50 and p99 in ms. Then one cache hit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import orjson

from local_engine.async_engine import AsyncEngine
from local_engine.engine import Engine, EngineConfig
from local_engine.grammar import GrammarCompiler, json_schema_grammar
from local_engine.sequence import SamplingParams
from local_engine.structured import compile_structured, parse_structured

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data"
PEOPLE = {"type": "array", "items": {
    "type": "object", "properties": {"name": {"type": "string"}, "city": {"type": "string"},
                                     "age": {"type": "integer"}},
    "required": ["name", "city", "age"], "additionalProperties": False}}

__all__ = ["structured", "structured_summary"]


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return round(s[min(len(s) - 1, max(0, round(q / 100 * len(s)) - 1))], 2)


def compile_times(compiler: GrammarCompiler, rounds: int) -> dict[str, Any]:
    tools = json.loads((DATA / "agent_traces" / "tau_airline_tools.json").read_text())
    choices: list[Any] = ["auto", "required"] + [
        {"type": "function", "function": {"name": t["function"]["name"]}} for t in tools]
    times = []
    for _ in range(rounds):
        for choice in choices:
            fresh = GrammarCompiler(compiler.tokenizer)  # same tokenizer, empty cache
            t0 = time.perf_counter()
            compile_structured(fresh, parse_structured({"tools": tools,
                                                        "tool_choice": choice}))
            times.append((time.perf_counter() - t0) * 1e3)
    structured = parse_structured({"tools": tools, "tool_choice": "required"})
    compile_structured(compiler, structured)
    t0 = time.perf_counter()
    compile_structured(compiler, structured)
    hit = (time.perf_counter() - t0) * 1e3
    return {"grammars": len(times), "tools": len(tools), "p50_ms": _pct(times, 50),
            "p99_ms": _pct(times, 99), "max_ms": round(max(times), 2),
            "cache_hit_ms": round(hit, 3)}


async def _run(engine: AsyncEngine, prompts: list[list[int]], params: SamplingParams
               ) -> tuple[float, int, int]:
    """(wall s, output tokens, sequences whose grammar ended before the limit)."""
    tokens = ended = 0

    async def one(ids: list[int]) -> None:
        nonlocal tokens, ended
        async for out in engine.generate(ids, params):
            if out.finished:
                tokens += len(out.seq.output_ids)
                matcher = out.seq.matcher
                ended += matcher is not None and matcher.is_stopped()

    t0 = time.perf_counter()
    await asyncio.gather(*(one(p) for p in prompts))
    return time.perf_counter() - t0, tokens, ended


async def structured(loaded: Any, args: argparse.Namespace) -> dict[str, Any]:
    tok = loaded.tokenizer
    compiler = GrammarCompiler.from_hf(tok, loaded.eos_token_ids)
    grammar = compiler.compile(json_schema_grammar(PEOPLE))
    questions = [orjson.loads(line)["turns"][0] for line in
                 (DATA / "prompts" / "vicuna_bench_questions.jsonl").read_text().splitlines()]
    ids = [list(tok.apply_chat_template(
        [{"role": "user", "content": q + "\nList the people involved as a JSON array."}],
        add_generation_prompt=True, tokenize=True)["input_ids"]) for q in questions[:32]]
    engine = AsyncEngine(Engine(loaded.model, lambda x: tok.decode(x), EngineConfig(
        max_num_seqs=32, max_batch_tokens=512, kv_cache_mb=256, speculative=None),
        loaded.eos_token_ids)).start()
    n = args.structured_max_tokens
    free = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    constrained = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, grammar=grammar)
    result: dict[str, Any] = {"max_tokens": n, "rounds": args.structured_rounds}

    async def measure() -> None:
        await _run(engine, ids[:2], SamplingParams(temperature=0, max_tokens=4))  # warm-up
        for batch in (1, 32):
            runs: dict[str, list[float]] = {"free": [], "constrained": []}
            ended = 0
            for _ in range(args.structured_rounds):
                for name, params in (("free", free), ("constrained", constrained)):
                    wall, tokens, stopped = await _run(engine, ids[:batch], params)
                    runs[name].append(tokens / wall)
                    ended += stopped
            f, c = statistics.median(runs["free"]), statistics.median(runs["constrained"])
            result[f"batch_{batch}"] = {
                "free_tok_s": round(f, 1), "constrained_tok_s": round(c, 1),
                "ratio": round(c / f, 3), "grammar_ended": ended,
                "runs_free": [round(x, 1) for x in runs["free"]],
                "runs_constrained": [round(x, 1) for x in runs["constrained"]]}

    try:
        await measure()
    finally:
        engine.close()
    result["compile_tau_tools"] = compile_times(compiler, args.structured_compile_rounds)
    return result


def structured_summary(s: dict[str, Any]) -> str:
    c = s["compile_tau_tools"]
    return ("grammar-constrained vs free decoding: " + "; ".join(
        f"batch {b}: {s[f'batch_{b}']['constrained_tok_s']} vs {s[f'batch_{b}']['free_tok_s']} "
        f"tok/s = {s[f'batch_{b}']['ratio']}x" for b in (1, 32))
        + f"; compiling the τ-bench tools' grammars ({c['grammars']}) p50 {c['p50_ms']} ms, "
        f"p99 {c['p99_ms']} ms, cache hit {c['cache_hit_ms']} ms")
